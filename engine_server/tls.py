"""`mmgate engine` over TLS: --tls-cert-path/--tls-key-path (SMG's names for its server's
certificate) and --tls-ca-cert-path, the CA client certificates must chain to (mutual TLS:
a client without one is refused in the handshake). Without them the server speaks h2c."""

from __future__ import annotations

import argparse
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class ServerTls:
    cert_path: Path
    key_path: Path
    client_ca_path: Path | None = None  # mutual TLS: a client certificate is required

    def credentials(self) -> grpc.ServerCredentials:
        pair = (self.key_path.read_bytes(), self.cert_path.read_bytes())
        ca = self.client_ca_path.read_bytes() if self.client_ca_path else None
        # require_client_auth: without it gRPC only *asks* for a client certificate (SGLang's
        # gRPC server in smg-grpc-servicer leaves it so) and lets a client without one in.
        return grpc.ssl_server_credentials(
            [pair], root_certificates=ca, require_client_auth=ca is not None
        )


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--tls-cert-path",
        type=Path,
        metavar="PATH",
        help="serve gRPC over TLS with this certificate (PEM; SMG's flag name); clients dial "
        "grpcs://. Default: plain text (h2c)",
    )
    group.add_argument(
        "--tls-key-path", type=Path, metavar="PATH", help="its private key (PEM, unencrypted)"
    )
    group.add_argument(
        "--tls-ca-cert-path",
        type=Path,
        metavar="PATH",
        help="require a client certificate signed by this CA (PEM): mutual TLS",
    )


def from_args(args: argparse.Namespace) -> ServerTls | None:
    """The settings, checked before the model loads (the files load, key and certificate
    match). ValueError says why."""
    cert, key, ca = args.tls_cert_path, args.tls_key_path, args.tls_ca_cert_path
    if cert is None and key is None:
        if ca is not None:
            raise ValueError("--tls-ca-cert-path needs --tls-cert-path and --tls-key-path")
        return None
    if cert is None or key is None:
        given, missing = ("--tls-cert-path", "--tls-key-path")[:: 1 if cert else -1]
        raise ValueError(f"{given} needs {missing}")
    try:
        for path in (cert, key, ca):
            if path is not None:
                path.read_bytes()  # (ssl's own errors do not name the file)
    except OSError as error:
        raise ValueError(f"cannot read {error.filename}: {error.strerror}") from None
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        if ca is not None:
            context.load_verify_locations(cafile=str(ca))
    except (ssl.SSLError, OSError) as error:
        files = " ".join(str(p) for p in (cert, key, ca) if p)
        raise ValueError(f"cannot load the TLS files ({files}): {error}") from None
    return ServerTls(cert, key, ca)
