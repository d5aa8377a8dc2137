"""StreamChannel: server-streaming gRPC calls to one worker over a connection opened on demand
(the public face of gateway.transport)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Sequence

import grpc

from gateway.transport.connection import Connection
from gateway.transport.frames import REFUSED_RETRIES, Payload, rpc_error

__all__ = ["StreamChannel"]


class StreamChannel:
    """Server-streaming gRPC calls to one `host:port`, over a connection opened on demand.
    `tls`: an ssl context offering ALPN h2 and the name the server's certificate must carry;
    the connection is then TLS or nothing (never plain text)."""

    def __init__(
        self,
        address: str,
        connect_timeout: float = 10.0,
        tls: tuple[ssl.SSLContext, str] | None = None,
    ) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.authority = address
        self.connect_timeout = connect_timeout
        self.tls = tls
        self._connection: Connection | None = None
        self._connecting: asyncio.Future | None = None

    async def stream(
        self, path: str, payload: Payload, metadata: Sequence[tuple[str, str]] = ()
    ) -> AsyncIterator[bytes]:
        """Send one request message (bytes, or pieces sent one after another) with custom
        `metadata`; yield each response message's bytes as it arrives.
        Closing the iterator early cancels the call on the server. A stream the server refused
        (it may still count one that just ended against its concurrency limit) is sent again."""
        for attempt in range(REFUSED_RETRIES + 1):
            connection = await self._connect()
            await connection.wait_for_slot()
            stream, body, sent = connection.open(path, payload, metadata)
            try:
                if sent < len(body):
                    await connection.send_rest(stream, body, sent)
                while True:
                    if stream.messages:
                        messages, stream.messages = stream.messages, []
                        for message in messages:
                            yield message
                    elif stream.done:
                        break
                    else:
                        stream.waiter = asyncio.get_running_loop().create_future()
                        await stream.waiter
                        stream.waiter = None
            finally:
                connection.cancel(stream)
            if not stream.refused or attempt == REFUSED_RETRIES:
                break
            await asyncio.sleep(0.001 * 2**attempt)
        if stream.error is not None:
            raise stream.error

    async def _connect(self) -> Connection:
        connection = self._connection
        if connection is not None and connection.accepting:
            return connection
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._dial())
        try:
            return await asyncio.shield(self._connecting)
        finally:
            if self._connecting is not None and self._connecting.done():
                self._connecting = None

    async def _dial(self) -> Connection:
        loop = asyncio.get_running_loop()
        secure = self.tls is not None
        kwargs = {"ssl": self.tls[0], "server_hostname": self.tls[1]} if self.tls else {}
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    lambda: Connection(self.authority, secure), self.host, self.port, **kwargs
                ),
                self.connect_timeout,
            )
        except (OSError, asyncio.TimeoutError) as exc:  # ssl.SSLError is an OSError
            what = "TLS handshake with" if secure else "connect to"
            raise rpc_error(
                grpc.StatusCode.UNAVAILABLE, f"cannot {what} {self.authority}: {exc!r}"
            ) from None
        if connection.refusal:  # e.g. a TLS server that does not speak HTTP/2
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"{self.authority}: {connection.refusal}")
        self._connection = connection
        return connection

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and connection.transport is not None:
            connection.transport.close()
