"""Worker addresses: what `--worker`, `--worker-dns` and POST /admin/workers accept."""

from __future__ import annotations

import pytest

from gateway.errors import GatewayError
from gateway.workers.worker import parse_address

GOOD = {
    "grpc://127.0.0.1:50051": "127.0.0.1:50051",
    "grpc://[::1]:50051": "[::1]:50051",
    "grpc://engine-0.engines.default.svc.cluster.local:50051": (
        "engine-0.engines.default.svc.cluster.local:50051"
    ),
    "localhost:1": "localhost:1",
    "grpcs://engine.example:443": "engine.example:443",
    "grpcs://[::1]:50051": "[::1]:50051",
}
BAD = [
    "grpc://a:0",  # no port 0
    "grpc://a:65536",
    "grpc://::1:5",  # IPv6 without brackets
    "grpc://[1.2.3.4]:5",
    "grpc://x:²",  # a digit, not an ASCII one
    "grpc://-a:1",
    "grpc://a b:1",
    "grpc://£/&:1",
    "grpc://:5",
    "http://a:1",
    "https://a:1",
    "grpcs://grpc://a:1",
    "grpc://grpcs://a:1",
    "a",
]


@pytest.mark.parametrize(("url", "address"), GOOD.items())
def test_addresses_taken(url, address):
    assert parse_address(url) == address


@pytest.mark.parametrize("url", BAD)
def test_addresses_refused_with_a_400_naming_the_url(url):
    with pytest.raises(GatewayError) as refused:
        parse_address(url)
    assert (refused.value.status, refused.value.param) == (400, "url")
    assert "grpc://HOST:PORT" in refused.value.message
