"""A response as the caller sees it: status and headers at once, the body as it arrives."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping

from backends.httpclient.connection import Connection, Pool
from backends.httpclient.errors import ProtocolError


class Headers(Mapping[str, str]):
    """Response header fields by case-insensitive name; repeated fields joined with ``", "``."""

    __slots__ = ("_fields",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        fields: dict[str, str] = {}
        for name, value in raw:
            key, text = name.decode("latin-1").lower(), value.decode("latin-1").strip()
            fields[key] = f"{fields[key]}, {text}" if key in fields else text
        self._fields = fields

    def __getitem__(self, name: str) -> str:
        return self._fields[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return f"Headers({self._fields!r})"


class Response:
    """One response: status and headers at once, the body as it arrives. Call ``release`` when done."""

    __slots__ = ("_client", "_conn", "_content_type", "_headers", "_raw_headers", "_trailers", "status")

    def __init__(self, client: Pool, conn: Connection) -> None:
        self._client = client
        self._conn: Connection | None = conn
        self.status = conn.status
        self._raw_headers = conn.raw_headers
        self._trailers = conn.trailers
        self._content_type = conn.content_type
        self._headers: Headers | None = None

    @property
    def headers(self) -> Headers:
        if self._headers is None:
            self._headers = Headers(self._raw_headers)
        return self._headers

    @property
    def trailers(self) -> Headers:
        """A chunked body's trailer fields received so far (all of them once the body is read)."""
        return Headers(self._trailers)

    @property
    def content_type(self) -> str:
        """The media type, lower-cased, without parameters (``"text/event-stream"``); ``""`` if none."""
        return self._content_type.partition(b";")[0].strip().lower().decode("latin-1")

    @property
    def arrived_at(self) -> float:
        """``time.perf_counter()`` when the server's bytes last arrived: the end of a wait for them,
        whatever the event loop did before the reader resumed."""
        return self._conn.arrived if self._conn is not None else 0.0

    @property
    def complete(self) -> bool:
        """The whole body has been received (not necessarily read)."""
        return self._conn is None or self._conn.done

    async def read_chunk(self) -> bytes:
        """The body bytes received since the last call, waiting for some if none are; ``b""`` at the end."""
        while True:
            data = self.take_chunk()
            if data is not None:
                return data
            try:
                await self.wait()
            except BaseException:
                self.close()
                raise

    def take_chunk(self) -> bytes | None:
        """The body bytes received since the last call, without waiting: ``b""`` at the end, None when
        none came yet (await ``wait``, then ask again). A failure closes the response."""
        conn = self._conn
        if conn is None:
            raise ProtocolError("the response was released")
        try:
            while conn.chunks:
                data = conn.take()
                if data:
                    return data
                # compressed bytes that decoded to nothing yet
            if conn.done:
                if conn.decoder is not None and not conn.decoder.eof:
                    raise ProtocolError("the compressed body was cut short")
                return b""
            if conn.error is not None:
                raise conn.error
            return None
        except BaseException:
            self.close()
            raise

    def wait(self, listener: Callable[[], bool] | None = None) -> asyncio.Future[None]:
        """Resolved when more of the body (or its end, or a failure) has arrived; fails with
        ``ReadTimeout`` after the client's read timeout without any (the caller closes the response).
        ``listener``: called first as body bytes arrive, in the connection's callback; when it says
        True it has taken them (``take_chunk``) and the wait goes on, its deadline moved."""
        conn = self._conn
        if conn is None:
            raise ProtocolError("the response was released")
        conn.listener = listener
        return conn.wait(self._client.read_timeout_s)

    def waiting_on(self) -> None:
        """A listener that took the bytes keeps the wait: its read deadline starts again."""
        conn = self._conn
        if conn is not None:
            conn.deadline.start(self._client.read_timeout_s, False)

    async def read(self) -> bytes:
        """The rest of the body."""
        parts = []
        while chunk := await self.read_chunk():
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Done with this response: its connection goes back to the pool if the response came in whole
        and the server keeps the connection open, and is closed otherwise."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.listener = None
            self._client.release(conn)

    def close(self) -> None:
        """Done with this response and its connection: the server sees the connection close."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.listener = None
            conn.abort()
            self._client.release(conn)
