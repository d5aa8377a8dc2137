"""The playground's files as the gateway serves them: the page at / and /playground, its
files by name only, a CSP that allows this origin alone, off with --no-playground, open
while the API behind it keeps its key. (The page itself runs in a real browser in
tests/e2e/gateway/test_playground.py.)"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from gateway.playground.routes import static_files
from gateway.server.app import create_app
from gateway.server.config import GatewayConfig


def get(paths: list[str], **config) -> list[httpx.Response]:
    # No lifespan: no worker pool is started, and these routes need none.
    app = create_app(GatewayConfig(model=Path("/nonexistent"), workers=[], **config))

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return [await client.get(path) for path in paths]

    return asyncio.run(run())


def test_the_page_is_served_at_the_root_and_at_playground():
    root, named = get(["/", "/playground"])
    assert root.status_code == named.status_code == 200
    assert root.headers["content-type"] == "text/html; charset=utf-8"
    assert root.text == named.text and "<title>mmgate playground</title>" in root.text


def test_every_answer_forbids_other_origins():
    for reply in get(["/", "/playground/main.js", "/playground/playground.css"]):
        csp = dict(
            part.strip().split(" ", 1)
            for part in reply.headers["content-security-policy"].split(";")
        )
        assert csp["default-src"] == "'none'"
        assert csp["script-src"] == csp["style-src"] == csp["connect-src"] == "'self'"
        assert csp["frame-ancestors"] == "'none'"
        # what the user attaches is previewed from the tab's own data: and blob: URLs only
        assert csp["img-src"] == "'self' data: blob:"
        assert csp["media-src"] == "blob:"
        assert reply.headers["x-content-type-options"] == "nosniff"
        assert reply.headers["referrer-policy"] == "no-referrer"
        # the microphone for this page only (a recording for a model that takes audio)
        permissions = reply.headers["permissions-policy"].split(", ")
        assert "microphone=(self)" in permissions and "camera=()" in permissions


@pytest.mark.parametrize(
    ("path", "status", "content_type"),
    [
        ("/playground/main.js", 200, "text/javascript; charset=utf-8"),
        ("/playground/playground.css", 200, "text/css; charset=utf-8"),
        ("/playground/nothing.js", 404, None),
        ("/playground/..%2Froutes.py", 404, None),
        ("/playground/%2E%2E%2F__init__.py", 404, None),
    ],
)
def test_files_are_served_by_name_only(path, status, content_type):
    (reply,) = get([path])
    assert reply.status_code == status
    if content_type:
        assert reply.headers["content-type"] == content_type


def test_no_playground_serves_no_page():
    assert [
        r.status_code for r in get(["/", "/playground", "/playground/main.js"], playground=False)
    ] == [404] * 3


def test_the_page_is_open_while_the_api_keeps_its_key():
    page, models = get(["/", "/v1/models"], api_keys=["secret"])
    assert page.status_code == 200
    assert models.status_code == 401


def test_what_the_page_loads_is_served_and_local():
    """Every file the page and its modules name is one the gateway serves, by a relative URL
    (so nothing is asked of another origin, and a proxy may mount the gateway under a path)."""
    files = static_files()
    page = files["index.html"][0].decode()
    named = re.findall(r'(?:src|href)="([^"]+)"', page)
    # openapi.json: the gateway's own API document, which the API reference links to
    assert named == ["data:,", "playground/playground.css", "playground/main.js", "openapi.json"]
    for url in named[1:3]:
        assert url.removeprefix("playground/") in files
    for name, (body, _) in files.items():
        text = body.decode()
        assert "http://" not in text and "https://" not in text, name
        for module in re.findall(r'from "\./([^"]+)"', text):
            assert module in files, f"{name} imports {module}"
