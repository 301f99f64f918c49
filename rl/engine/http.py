"""A small HTTP/1.1 JSON server on anyio: routes map (method, path) to async handlers.

What it is: `HttpServer` listens on TCP, reads requests with Content-Length bodies over
keep-alive connections, decodes the body with orjson (a JSON object; empty or `null` is `{}`),
calls `handler(body) -> (status, payload)` and writes the payload as JSON (a `str` payload goes
out as text/plain, `None` as `null`). While a handler runs the connection is watched: if the client
hangs up, the handler is cancelled (SGLang aborts a request on disconnect; clients rely on it).
What it is not: a general web framework (no chunked request bodies, no streaming responses, no
TLS, no query strings: they are ignored), nor anything SGLang-specific (`server.py` is).

It runs inside the caller's task group and reports its bound port (port 0: an ephemeral one):

    server = HttpServer({("GET", "/health"): health}, HttpServerConfig(port=0))
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        print(server.url)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import anyio.abc
import orjson
from anyio.abc import SocketAttribute
from anyio.streams.buffered import BufferedByteReceiveStream
from msgspec import Struct

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Awaitable[tuple[int, Any]]]
"""async handler(body) -> (status, payload); body is the decoded JSON object ({} when empty)."""

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}
_HANGUPS = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError)


class HttpServerConfig(Struct, frozen=True, kw_only=True):
    """Where to listen and how much to read."""

    host: str = "127.0.0.1"
    """Interface to bind; loopback by default (the engine server has no authentication)."""
    port: int = 0
    """TCP port; 0 picks a free one (read it from `HttpServer.port` once started)."""
    max_header_bytes: int = 65536
    """Request line plus headers."""
    max_body_bytes: int = 256 * 1024 * 1024
    """Request body (a long prompt as JSON is a few MB; weights never travel this way)."""


class _Request(Struct, frozen=True, kw_only=True):
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HttpServer:
    """JSON routes over HTTP/1.1 keep-alive; cancel the enclosing scope to stop it.

    Example:
        async def echo(body): return 200, body
        server = HttpServer({("POST", "/echo"): echo})
        await tg.start(server.serve)   # server.port is now bound
        server.add_route("GET", "/late", handler)   # routes may be added at any time
    """

    def __init__(
        self,
        routes: Mapping[tuple[str, str], Handler] | None = None,
        config: HttpServerConfig = HttpServerConfig(),
    ) -> None:
        self.config = config
        self.routes: dict[tuple[str, str], Handler] = dict(routes or {})
        self.port: int | None = None
        self.requests = 0

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the server is not listening yet")
        return f"http://{self.config.host}:{self.port}"

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        self.routes[(method.upper(), path)] = handler

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Bind, report started, then serve connections until cancelled."""
        listener = await anyio.create_tcp_listener(
            local_host=self.config.host, local_port=self.config.port
        )
        self.port = listener.extra(SocketAttribute.local_port)
        async with listener:
            task_status.started()
            await listener.serve(self._connection)

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            reader = BufferedByteReceiveStream(stream)
            while True:
                try:
                    request = await self._read(reader)
                except _HANGUPS + (anyio.IncompleteRead,):
                    return
                except _BadRequest as bad:
                    await _send(stream, _response(bad.status, {"message": str(bad)}, False))
                    return
                keep = _keep_alive(request)
                answer = await self._answer(stream, reader, request)
                if answer is None:  # the client hung up; the handler was cancelled
                    return
                if not await _send(stream, _response(*answer, keep)) or not keep:
                    return

    async def _read(self, reader: BufferedByteReceiveStream) -> _Request:
        try:
            head = await reader.receive_until(b"\r\n\r\n", self.config.max_header_bytes)
        except anyio.DelimiterNotFound as exc:
            raise _BadRequest(431, "request head too large") from exc
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            raise _BadRequest(400, f"bad request line {lines[0][:100]!r}")
        method, target, version = parts
        headers = {"_version": version}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise _BadRequest(501, "chunked request bodies are not supported")
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError as exc:
            raise _BadRequest(400, "bad content-length") from exc
        if length < 0 or length > self.config.max_body_bytes:
            raise _BadRequest(413, f"body of {length} bytes")
        body = await reader.receive_exactly(length) if length else b""
        path = target.split("?", 1)[0]
        return _Request(method=method.upper(), path=path, headers=headers, body=body)

    async def _answer(
        self, stream: anyio.abc.SocketStream, reader: BufferedByteReceiveStream, request: _Request
    ) -> tuple[int, Any] | None:
        """Run the route's handler while watching for a hang-up; None if the client left."""
        handler = self.routes.get((request.method, request.path))
        if handler is None:
            if any(path == request.path for _, path in self.routes):
                return 405, {"message": f"{request.method} not allowed on {request.path}"}
            return 404, {"detail": "Not Found"}
        try:
            body = orjson.loads(request.body) if request.body else None
        except orjson.JSONDecodeError as exc:
            return 400, {"message": f"invalid JSON body: {exc}"}
        if body is None:
            body = {}
        if not isinstance(body, dict):
            return 400, {"message": f"a JSON object was expected, got {type(body).__name__}"}
        self.requests += 1
        answer: tuple[int, Any] | None = None
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                nonlocal answer
                answer = await _call(handler, body, request.path)
                tg.cancel_scope.cancel()

            tg.start_soon(run)
            await _watch_hangup(stream, reader, self.config.max_header_bytes)
            tg.cancel_scope.cancel()  # the client left: cancel the handler
        return answer


async def _call(handler: Handler, body: Any, path: str) -> tuple[int, Any]:
    try:
        return await handler(body)
    except Exception as exc:  # a handler bug must not kill the server; the client sees a 500
        log.exception("handler for %s failed", path)
        return 500, {"message": f"{type(exc).__name__}: {exc}"}


async def _watch_hangup(
    stream: anyio.abc.SocketStream, reader: BufferedByteReceiveStream, limit: int
) -> None:
    """Return when the peer closes; bytes it sends meanwhile (pipelining) are kept for later,
    and past `limit` of them the watch ends (the handler then runs to completion)."""
    buffered = 0
    while buffered < limit:
        try:
            data = await stream.receive()
        except _HANGUPS:
            return
        reader.feed_data(data)
        buffered += len(data)
    await anyio.sleep_forever()


def _keep_alive(request: _Request) -> bool:
    connection = request.headers.get("connection", "").lower()
    if request.headers["_version"] == "HTTP/1.0":
        return connection == "keep-alive"
    return connection != "close"


async def _send(stream: anyio.abc.SocketStream, data: bytes) -> bool:
    try:
        await stream.send(data)
    except _HANGUPS:
        return False
    return True


def _response(status: int, payload: Any, keep_alive: bool) -> bytes:
    if isinstance(payload, str):
        body, ctype = payload.encode(), "text/plain; charset=utf-8"
    else:
        body, ctype = orjson.dumps(payload), "application/json"
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
        f"content-type: {ctype}\r\ncontent-length: {len(body)}\r\n"
        f"connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode("latin-1") + body
