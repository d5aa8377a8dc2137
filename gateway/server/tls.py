"""TLS on the gateway's HTTP port, on vLLM 0.32's flags (`--ssl-keyfile`, `--ssl-certfile`,
`--ssl-ca-certs`, `--ssl-cert-reqs`, `--ssl-ciphers`, `--enable-ssl-refresh`).

As in vLLM, uvicorn builds the SSL context from the files (uvicorn.config.create_ssl_context),
so the handshake is the one vLLM's server offers. A plain-http request to the port fails its
handshake: the client gets a closed connection, never a page.

`--enable-ssl-refresh` reloads the certificate chain (and the CA file) into that same context
when the files change, so new connections get the new certificate without a restart; open
ones keep theirs. vLLM watches the files with watchfiles (inotify); we read them instead, once
a second (a few KiB), because a Kubernetes secret volume swaps a `..data` symlink rather than
writing the files, which an inotify watch on the files' paths does not see.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import ssl
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import uvicorn

log = logging.getLogger("mmgate.gateway")
REFRESH_SECONDS = 1.0
CERT_REQS = {0: "CERT_NONE", 1: "CERT_OPTIONAL", 2: "CERT_REQUIRED"}


@dataclass(frozen=True)
class HttpTls:
    """The HTTP port's TLS settings; picklable, so every process of `--api-server-count N`
    builds its own context from them."""

    keyfile: str
    certfile: str
    ca_certs: str | None = None
    cert_reqs: int = int(ssl.CERT_NONE)
    ciphers: str | None = None
    refresh: bool = False

    def uvicorn_kwargs(self) -> dict[str, object]:
        """uvicorn.Config's arguments, as vLLM's launcher passes them."""
        return {
            "ssl_keyfile": self.keyfile,
            "ssl_certfile": self.certfile,
            "ssl_ca_certs": self.ca_certs,
            "ssl_cert_reqs": self.cert_reqs,
            "ssl_ciphers": self.ciphers,
        }

    def watched(self) -> tuple[str, ...]:
        return (self.certfile, self.keyfile) + ((self.ca_certs,) if self.ca_certs else ())


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "TLS on the HTTP port",
        "vLLM's flags. With a certificate and key the port speaks https only; plain http to it "
        "fails its handshake.",
    )
    g.add_argument("--ssl-keyfile", metavar="PATH", help="the server certificate's private key")
    g.add_argument("--ssl-certfile", metavar="PATH", help="the server certificate (chain), PEM")
    g.add_argument(
        "--ssl-ca-certs",
        metavar="PATH",
        help="CA certificates client certificates are checked against (mutual TLS)",
    )
    g.add_argument(
        "--ssl-cert-reqs",
        type=int,
        choices=sorted(CERT_REQS),
        default=int(ssl.CERT_NONE),
        help="client certificates: 0 not asked for, 1 checked if given, 2 required (the ssl "
        "module's CERT_NONE, CERT_OPTIONAL, CERT_REQUIRED; default: %(default)s)",
    )
    g.add_argument(
        "--ssl-ciphers",
        metavar="LIST",
        help="OpenSSL cipher list for TLS 1.2 and below (TLS 1.3's suites are not affected)",
    )
    g.add_argument(
        "--enable-ssl-refresh",
        action="store_true",
        help="reload the certificate, key and CA file when they change: new connections get "
        "the new certificate without a restart (checked every second)",
    )


def from_args(args: argparse.Namespace) -> HttpTls | None:
    """The settings, or None for plain http. Raises ValueError for flags that cannot work
    together (an operator asking for mutual TLS without a CA would refuse every client)."""
    if bool(args.ssl_keyfile) != bool(args.ssl_certfile):
        raise ValueError("--ssl-keyfile and --ssl-certfile must be given together")
    if not args.ssl_certfile:
        given = [
            flag
            for flag, value in (
                ("--ssl-ca-certs", args.ssl_ca_certs),
                ("--ssl-cert-reqs", args.ssl_cert_reqs != ssl.CERT_NONE),
                ("--ssl-ciphers", args.ssl_ciphers),
                ("--enable-ssl-refresh", args.enable_ssl_refresh),
            )
            if value
        ]
        if given:
            raise ValueError(f"{', '.join(given)} need --ssl-certfile and --ssl-keyfile")
        return None
    if args.ssl_cert_reqs != ssl.CERT_NONE and not args.ssl_ca_certs:
        raise ValueError("--ssl-cert-reqs 1 or 2 needs --ssl-ca-certs to check clients against")
    return HttpTls(
        keyfile=args.ssl_keyfile,
        certfile=args.ssl_certfile,
        ca_certs=args.ssl_ca_certs,
        cert_reqs=args.ssl_cert_reqs,
        ciphers=args.ssl_ciphers,
        refresh=args.enable_ssl_refresh,
    )


def server_config(app: object, tls: HttpTls | None, **kwargs: object) -> uvicorn.Config:
    """uvicorn's config for the gateway, with TLS when asked for."""
    return uvicorn.Config(app, **kwargs, **(tls.uvicorn_kwargs() if tls else {}))


class CertRefresher:
    """Reloads the files into the server's SSL context when their contents change."""

    def __init__(self, context: ssl.SSLContext, tls: HttpTls) -> None:
        self.context, self.tls = context, tls
        self.seen = self._digests()

    def _digests(self) -> tuple[bytes | None, ...]:
        """The files' digests: their contents, not their stat, since a file rewritten within
        the filesystem's timestamp granularity at the same size has the same stat."""
        out = []
        for path in self.tls.watched():
            try:  # (follows symlinks: a swapped secret volume changes what it reads)
                out.append(hashlib.sha256(Path(path).read_bytes()).digest())
            except OSError:
                out.append(None)
        return tuple(out)

    def check(self) -> bool:
        """Reloads if the files changed since the last check; True when it did."""
        now = self._digests()
        if now == self.seen:
            return False
        self.seen = now
        try:
            self.context.load_cert_chain(self.tls.certfile, self.tls.keyfile)
            if self.tls.ca_certs:
                # (adds to the trusted CAs: one removed from the file stays trusted until a
                # restart, as in vLLM)
                self.context.load_verify_locations(self.tls.ca_certs)
        except (OSError, ssl.SSLError) as error:
            # e.g. the certificate written and not yet its key: the next change retries
            log.error("TLS files changed but did not load (%s); serving the previous ones", error)
            return False
        log.info("TLS certificate reloaded from %s", self.tls.certfile)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            self.check()


class Server(uvicorn.Server):
    """uvicorn's server, with the certificate refresher running in its event loop."""

    def __init__(self, config: uvicorn.Config, tls: HttpTls | None) -> None:
        super().__init__(config)
        self.tls = tls

    async def serve(self, sockets: list | None = None) -> None:
        if not (self.tls and self.tls.refresh):
            await super().serve(sockets)
            return
        if not self.config.loaded:
            self.config.load()  # builds config.ssl, which the refresher reloads into
        task = asyncio.create_task(CertRefresher(self.config.ssl, self.tls).run())
        try:
            await super().serve(sockets)
        finally:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
