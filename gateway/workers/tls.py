"""TLS on the hop to the workers: `grpcs://HOST:PORT` workers, verified against
--ca-cert-paths (else the system's CAs), with an optional client certificate for mutual TLS.

SMG's flags and meaning (`smg launch --ca-cert-paths --client-cert-path --client-key-path`).
`grpc://` workers stay plain text (h2c); a `grpcs://` worker is never dialled in plain text,
whatever its handshake does. Both clients of a worker take the same settings: grpc.aio (unary
calls, and Generate under --stream-client grpcio) and our HTTP/2 stream client
(gateway.transport), which offers ALPN `h2` and refuses a server that does not pick it."""

from __future__ import annotations

import argparse
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

TLS_SCHEME = "grpcs://"
PLAIN_SCHEME = "grpc://"


@dataclass(frozen=True)
class WorkerTls:
    """Picklable settings (children of --api-server-count get them over the spawn pipe);
    the files are read when a worker's channels are made, so a rotated CA or client
    certificate reaches workers added later."""

    ca_cert_paths: tuple[Path, ...] = ()
    client_cert_path: Path | None = None
    client_key_path: Path | None = None

    @property
    def mutual(self) -> bool:
        """Whether a client certificate is sent (mutual TLS)."""
        return self.client_cert_path is not None

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        """For grpc.aio.secure_channel. Without --ca-cert-paths: the system's CA bundle (not
        the roots gRPC ships with), as Python's ssl and SMG use."""
        roots = b"".join(p.read_bytes() for p in self.ca_cert_paths) or _system_roots()
        if self.client_cert_path is None:
            return grpc.ssl_channel_credentials(root_certificates=roots)
        return grpc.ssl_channel_credentials(
            root_certificates=roots,
            private_key=self.client_key_path.read_bytes(),  # type: ignore[union-attr]
            certificate_chain=self.client_cert_path.read_bytes(),
        )

    def ssl_context(self) -> ssl.SSLContext:
        """For our HTTP/2 stream client: verifies the worker's chain and name, offers h2."""
        if self.ca_cert_paths:  # only the given CAs; PROTOCOL_TLS_CLIENT checks the name
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            for path in self.ca_cert_paths:
                context.load_verify_locations(cafile=str(path))
        else:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2  # RFC 9113 9.2: TLS 1.2 or later
        context.set_alpn_protocols(["h2"])
        if self.client_cert_path is not None:
            context.load_cert_chain(str(self.client_cert_path), str(self.client_key_path))
        return context


def _system_roots() -> bytes | None:
    """The system's CA bundle as PEM, or None (gRPC then uses its own roots)."""
    paths = ssl.get_default_verify_paths()
    for name in (paths.cafile, paths.openssl_cafile):
        if name and Path(name).is_file():
            return Path(name).read_bytes()
    return None


def is_tls(url: str) -> bool:
    return url.startswith(TLS_SCHEME)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "TLS to the workers",
        "For grpcs://HOST:PORT workers (--worker, --worker-dns, POST /admin/workers); SMG's "
        "flags. A grpcs:// worker whose handshake fails is unreachable, never dialled in "
        "plain text; grpc:// workers stay plain text.",
    )
    g.add_argument(
        "--ca-cert-paths",
        nargs="+",
        type=Path,
        default=[],
        metavar="PATH",
        help="CA certificate(s) (PEM) the workers' certificates must chain to; several "
        "allowed (default: the system's CAs)",
    )
    g.add_argument(
        "--client-cert-path",
        type=Path,
        metavar="PATH",
        help="client certificate (PEM) sent to grpcs:// workers, for mutual TLS "
        "(needs --client-key-path)",
    )
    g.add_argument(
        "--client-key-path",
        type=Path,
        metavar="PATH",
        help="the client certificate's private key (PEM, unencrypted)",
    )


def from_args(args: argparse.Namespace) -> WorkerTls:
    """The settings, checked now (files load, the key matches the certificate): a mistake is
    a usage error at start, not a worker that never answers. ValueError says why."""
    cert, key = args.client_cert_path, args.client_key_path
    if (cert is None) != (key is None):
        given, missing = ("--client-cert-path", "--client-key-path")[:: 1 if cert else -1]
        raise ValueError(f"{given} needs {missing}")
    settings = WorkerTls(tuple(args.ca_cert_paths), cert, key)
    try:
        for path in (*settings.ca_cert_paths, cert, key):
            if path is not None:
                path.read_bytes()  # (ssl's own errors do not name the file)
    except OSError as error:
        raise ValueError(f"cannot read {error.filename}: {error.strerror}") from None
    try:
        settings.ssl_context()
    except (ssl.SSLError, OSError) as error:
        files = " ".join(str(p) for p in (*settings.ca_cert_paths, cert, key) if p)
        raise ValueError(f"cannot load the worker TLS files ({files}): {error}") from None
    return settings
