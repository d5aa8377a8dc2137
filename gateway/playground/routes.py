"""Serves the playground's files: the page at `/` and `/playground`, its scripts and style
under `/playground/`.

The files are read once, at start, from the package; only those names are served, so no
request path reaches the file system. Every answer carries a Content-Security-Policy that
lets the page load and call nothing but this origin (scripts, styles and API calls), so the
page cannot be made to talk to anyone else, and it works air-gapped. The page is open (it
holds no secret); the API it calls stays behind `--api-key`, which the page asks for and keeps
in the tab's sessionStorage only.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
# Images the user picks are shown from data: and blob: URLs, videos and audio clips from blob:
# URLs (a <video> or <audio> loads under media-src, which default-src 'none' otherwise closes);
# nothing else is allowed anywhere.
CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "media-src blob:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    # The microphone for this page itself (recording a clip, for a model that takes audio; the
    # browser still asks the user), for no frame of any other origin.
    "Permissions-Policy": "camera=(), microphone=(self), geolocation=()",
    # Small files: always revalidate, so a gateway upgrade is never mixed with an old script.
    "Cache-Control": "no-cache",
}


def static_files() -> dict[str, tuple[bytes, str]]:
    """The playground's files by name: their bytes and content type."""
    root = resources.files(__package__) / "static"
    files = {}
    for entry in root.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in CONTENT_TYPES:
            files[entry.name] = (entry.read_bytes(), CONTENT_TYPES[suffix])
    return files


def playground_routes() -> APIRouter:
    """GET / and /playground (the page), /playground/NAME (its files); not in the OpenAPI
    document, which describes the API."""
    files = static_files()
    router = APIRouter(include_in_schema=False)

    def serve(name: str) -> Response:
        if name not in files:
            return Response("not found", 404, media_type="text/plain")
        body, content_type = files[name]
        return Response(body, headers=HEADERS, media_type=content_type)

    # HEAD too: link checkers and `curl -I` ask with it (FastAPI adds it to no route itself).
    @router.api_route("/", methods=["GET", "HEAD"])
    @router.api_route("/playground", methods=["GET", "HEAD"])
    async def page() -> Response:
        return serve("index.html")

    @router.api_route("/playground/{name}", methods=["GET", "HEAD"])
    async def asset(name: str) -> Response:
        return serve(name)

    return router
