"""A small asyncio HTTP/1.1 client for the HTTP benchmarks: one keep-alive connection, requests
with a Content-Length body, responses with Content-Length or chunked bodies, and a chunked body
read as it arrives (server-sent events). Lighter per request than a general client, so the load
generator takes less of the two cores from the server it measures.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


class HttpConnection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> HttpConnection:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()

    async def _send(self, path: str, body: bytes, content_type: str) -> dict[str, str]:
        assert self._reader is not None and self._writer is not None
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
            f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        self._writer.write(head.encode() + body)
        status_line = await self._reader.readline()
        status = int(status_line.split()[1])
        headers = {":status": str(status)}
        while (line := await self._reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return headers

    async def post(self, path: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        """The whole response body."""
        headers = await self._send(path, body, content_type)
        parts = [chunk async for chunk in self._body(headers)]
        return int(headers[":status"]), b"".join(parts)

    async def post_streaming(
        self, path: str, body: bytes, content_type: str
    ) -> AsyncIterator[bytes]:
        """The response body's pieces as they arrive."""
        headers = await self._send(path, body, content_type)
        async for chunk in self._body(headers):
            yield chunk

    async def _body(self, headers: dict[str, str]) -> AsyncIterator[bytes]:
        assert self._reader is not None
        if "content-length" in headers:
            yield await self._reader.readexactly(int(headers["content-length"]))
            return
        while True:
            size = int((await self._reader.readline()).split(b";")[0], 16)
            if size == 0:
                await self._reader.readline()
                return
            data = await self._reader.readexactly(size)
            await self._reader.readline()
            yield data
