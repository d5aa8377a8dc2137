"""`mmgate engine` over TLS: --tls-cert-path/--tls-key-path (SMG's names for its server's
certificate) and --tls-ca-cert-path, the CA client certificates must chain to (mutual TLS:
a client without one is refused in the handshake). Without them the server speaks h2c.

The files are read again before each new connection's handshake (gRPC's dynamic server
credentials ask before every handshake), so a renewed certificate or CA (a Kubernetes Secret
updated in place) is served without a restart; a set that does not load is logged and the
last good one stays."""

from __future__ import annotations

import argparse
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger("mmgate.engine")


@dataclass(frozen=True)
class ServerTls:
    cert_path: Path
    key_path: Path
    client_ca_path: Path | None = None  # mutual TLS: a client certificate is required

    def credentials(self) -> grpc.ServerCredentials:
        files = CertificateFiles(self)
        # require_client_authentication: without it gRPC only *asks* for a client certificate
        # (SGLang's gRPC server in smg-grpc-servicer leaves it so) and lets one without in.
        return grpc.dynamic_ssl_server_credentials(
            files.configuration(),
            files.changed,
            require_client_authentication=self.client_ca_path is not None,
        )

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        """The key, the certificate chain and the client CA, as they are on disk now."""
        ca = self.client_ca_path.read_bytes() if self.client_ca_path else None
        return self.key_path.read_bytes(), self.cert_path.read_bytes(), ca


class CertificateFiles:
    """The TLS files last served, and the check gRPC runs before each handshake."""

    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self.served = tls.read()

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        key, chain, ca = self.served
        return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=ca)

    def changed(self) -> grpc.ServerCertificateConfiguration | None:
        """The new configuration when the files changed and load; None keeps the current one
        (an exception here would fail the client's handshake)."""
        try:
            files = self.tls.read()
            if files == self.served:
                return None
            _load(self.tls.cert_path, self.tls.key_path, self.tls.client_ca_path)
        except (OSError, ssl.SSLError) as error:
            # a Secret half written, or a key that is not the certificate's: retried at the
            # next connection, the last good files served meanwhile
            log.warning("TLS files changed but do not load (%s); serving the previous ones", error)
            return None
        self.served = files
        log.info("TLS files changed: new connections get the new certificate")
        return self.configuration()


def _load(cert: Path, key: Path, ca: Path | None) -> None:
    """Raise when the files do not make a server context (ssl.SSLError or OSError)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    if ca is not None:
        context.load_verify_locations(cafile=str(ca))


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
        _load(cert, key, ca)
    except (ssl.SSLError, OSError) as error:
        files = " ".join(str(p) for p in (cert, key, ca) if p)
        raise ValueError(f"cannot load the TLS files ({files}): {error}") from None
    return ServerTls(cert, key, ca)
