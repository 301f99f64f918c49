"""A fake SGLang server: real HTTP/1.1 on loopback, SGLang's native JSON, deterministic tokens.

What it is: enough of SGLang's native API (`/generate` token-in/token-out with logprobs, and the
control endpoints of SGLang's `http_server.py`) for the client, router and launcher tests, plus
knobs to misbehave: latency, aborts partway, 500s, 400s, corrupt answers, dying and coming back
on the same port, pause/continue, weight updates that bump `weight_version` (a disk update
needs an existing directory).
What it is not: a model. Token t+1 is `next_token(t)`, its logprob `token_logprob(t+1)`, so the
same prompt always gives the same continuation and a resumed generation equals an unbroken one.

    async with FakeSGLangServer() as fake:
        fake.abort_next(after_tokens=3)
        client = SGLangClient(SGLangClientConfig(base_url=fake.url))
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import anyio
import orjson
from anyio.abc import SocketAttribute, SocketStream, TaskGroup
from anyio.streams.buffered import BufferedByteReceiveStream

VOCAB_SIZE = 32000
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def next_token(previous: int) -> int:
    return (previous * 31 + 7) % VOCAB_SIZE


def token_logprob(token: int) -> float:
    return -((token % 97) + 1) / 100.0


def expected_tokens(input_ids: list[int], max_new_tokens: int, stop_token_ids=()) -> list[int]:
    """What the fake generates for this prompt when nothing interrupts it."""
    out: list[int] = []
    last = input_ids[-1] if input_ids else 0
    while len(out) < max_new_tokens:
        last = next_token(last)
        out.append(last)
        if last in stop_token_ids:
            break
    return out


class _Running:
    __slots__ = ("aborted", "rid")

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.aborted = anyio.Event()


class FakeSGLangServer:
    """A loopback HTTP server speaking SGLang's native protocol, with scripted faults.

    Example:
        async with FakeSGLangServer(token_latency_s=0.01) as fake:
            fake.fail_next(2)             # the next two requests answer HTTP 500
            await fake.die(); await fake.revive()   # same port, all connections dropped
            assert fake.generate_requests[-1]["sampling_params"]["max_new_tokens"] == 16
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency_s: float = 0.0,
        token_latency_s: float = 0.0,
        model_path: str = "fake-model",
        tp_size: int = 1,
        policy: Callable[[list[int]], list[int]] | None = None,
        pause_abort_window_s: float = 0.25,
        vocab_size: int | None = None,
    ) -> None:
        self.host, self.port = host, port
        # A policy maps the prompt to the whole continuation (a scripted agent); without one the
        # fake emits its deterministic token chain.
        self.policy = policy
        self.vocab_size = vocab_size  # tokens of the chain stay below it, as a model's would
        self.latency_s = latency_s
        self.token_latency_s = token_latency_s
        self.model_path, self.tp_size = model_path, tp_size
        self.weight_version = "default"
        self.healthy = True
        self.fail_weight_updates = False
        self.generate_requests: list[dict[str, Any]] = []
        self.control_requests: list[tuple[str, Any]] = []
        self.released_tags: set[str] = set()
        self._fail: list[int] = []
        self._reject = 0
        self._corrupt = 0
        self._aborts: list[int] = []
        self._running: dict[str, _Running] = {}
        self._waiting: dict[str, _Running] = {}  # registered, held at the pause gate
        # SGLang's abort-mode pause repeats abort-all (about once a second) until no request
        # runs; a request that arrives in that window and waits at the gate is marked too and
        # answered 499 after continue. The fake's window is shorter, to keep tests fast.
        self.pause_abort_window_s = pause_abort_window_s
        self._abort_window_until = 0.0
        self._unpaused = anyio.Event()
        self._unpaused.set()
        self._tg: TaskGroup | None = None
        self._serve_scope: anyio.CancelScope | None = None
        self._served = anyio.Event()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def in_flight(self) -> int:
        return len(self._running)

    # Scripted behaviour ---------------------------------------------------------------------

    def fail_next(self, n: int, status: int = 500) -> None:
        """The next n requests to any endpoint answer `status`."""
        self._fail += [status] * n

    def reject_next(self, n: int) -> None:
        """The next n /generate requests answer 400 (SGLang's error for a bad request)."""
        self._reject += n

    def corrupt_next(self, n: int) -> None:
        """The next n /generate answers carry one logprob fewer than output_ids."""
        self._corrupt += n

    def abort_next(self, after_tokens: int, count: int = 1) -> None:
        """The next `count` /generate requests end as `abort` after `after_tokens` tokens."""
        self._aborts += [after_tokens] * count

    # Lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> FakeSGLangServer:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        await self.revive()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        return await self._tg.__aexit__(*exc)

    async def die(self) -> None:
        """Close the listener and every open connection, as a crashed server would."""
        if self._serve_scope is not None:
            self._serve_scope.cancel()
            await self._served.wait()
            self._serve_scope = None
        self._running.clear()

    async def revive(self) -> None:
        """Listen again on the same port (the first call picks a free port if port was 0)."""
        assert self._tg is not None
        listener = await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
        self.port = listener.extra(SocketAttribute.local_port)
        self._served = anyio.Event()
        await self._tg.start(self._serve, listener)

    async def _serve(self, listener: Any, *, task_status: Any) -> None:
        try:
            with anyio.CancelScope() as scope:
                self._serve_scope = scope
                task_status.started()
                async with listener:
                    await listener.serve(self._connection)
        finally:
            self._served.set()

    # HTTP/1.1 -------------------------------------------------------------------------------

    async def _connection(self, stream: SocketStream) -> None:
        gone = (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, anyio.ClosedResourceError)
        async with stream:
            reader = BufferedByteReceiveStream(stream)
            while True:
                try:
                    head = await reader.receive_until(b"\r\n\r\n", 65536)
                except gone:
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = dict(_split_header(line) for line in lines[1:] if ":" in line)
                length = int(headers.get("content-length", "0"))
                try:  # a client killed between a request's head and its body (a SIGINT'd run)
                    body = await reader.receive_exactly(length) if length else b""
                except gone:
                    return
                status, payload = await self._dispatch(method, target.split("?")[0], body)
                keep = headers.get("connection", "").lower() != "close"
                try:
                    await stream.send(_response(status, payload, keep))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return
                if not keep:
                    return

    async def _dispatch(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        data = orjson.loads(body) if body else None
        if self._fail:
            return self._fail.pop(0), {"error": {"message": "injected failure"}}
        if path == "/generate":
            return await self._generate(data)
        self.control_requests.append((path, data))
        handler = _ROUTES.get(path)
        if handler is None:
            return 404, {"detail": "Not Found"}
        return await handler(self, data or {})

    # Endpoints ------------------------------------------------------------------------------

    async def _generate(self, data: dict[str, Any]) -> tuple[int, Any]:
        self.generate_requests.append(data)
        if self._reject:
            self._reject -= 1
            return 400, {"error": {"message": "input is longer than the context (injected)"}}
        sampling = data.get("sampling_params") or {}
        budget = int(sampling.get("max_new_tokens", 128))
        stops = set(sampling.get("stop_token_ids") or ())
        abort_after = self._aborts.pop(0) if self._aborts else None
        run = _Running(data.get("rid") or "")
        if not self._unpaused.is_set():
            if time.monotonic() < self._abort_window_until:
                run.aborted.set()
            self._waiting[run.rid] = run
            try:
                await self._unpaused.wait()
            finally:
                self._waiting.pop(run.rid, None)
            if run.aborted.is_set():
                return 499, {"error": {"message": f"Request {run.rid} was aborted"}}
        self._running[run.rid] = run
        try:
            with anyio.move_on_after(self.latency_s):
                await run.aborted.wait()
            tokens, finish = await self._decode(run, data["input_ids"], budget, stops, abort_after)
        finally:
            self._running.pop(run.rid, None)
        return 200, self._answer(data, tokens, finish)

    async def _decode(
        self,
        run: _Running,
        input_ids: list[int],
        budget: int,
        stops: set[int],
        abort_after: int | None,
    ) -> tuple[list[int], str]:
        if self.policy is not None and abort_after is None:
            tokens = self.policy(input_ids)[:budget]
            stopped = bool(tokens) and tokens[-1] in stops
            return tokens, "stop" if stopped or len(tokens) < budget else "length"
        tokens: list[int] = []
        last = input_ids[-1] if input_ids else 0
        while True:
            if run.aborted.is_set() or (abort_after is not None and len(tokens) >= abort_after):
                return tokens, "abort"
            if len(tokens) >= budget:
                return tokens, "length"
            await self._unpaused.wait()
            if self.token_latency_s:
                with anyio.move_on_after(self.token_latency_s):
                    await run.aborted.wait()
                if run.aborted.is_set():
                    continue
            last = next_token(last) if self.vocab_size is None else next_token(last) % self.vocab_size
            tokens.append(last)
            if last in stops:
                return tokens, "stop"

    def _answer(self, data: dict[str, Any], tokens: list[int], finish: str) -> dict[str, Any]:
        logprobs = [[token_logprob(t), t, None] for t in tokens]
        if self._corrupt and tokens:
            self._corrupt -= 1
            logprobs = logprobs[:-1]
        reason: dict[str, Any] = {"type": finish}
        if finish == "abort":
            reason.update(message="Abort in waiting queue", status_code=None)
        return {
            "output_ids": tokens,
            "meta_info": {
                "id": data.get("rid"),
                "finish_reason": reason,
                "prompt_tokens": len(data["input_ids"]),
                "completion_tokens": len(tokens),
                "cached_tokens": 0,
                "weight_version": self.weight_version,
                "output_token_logprobs": logprobs,
            },
        }

    async def _health(self, data: Any) -> tuple[int, Any]:
        return (200, None) if self.healthy else (503, None)

    async def _flush(self, data: Any) -> tuple[int, Any]:
        # Like SGLang: refused while requests run; requests held by a pause are not running.
        return (400 if self._running else 200), "Cache flushed.\n"

    async def _abort(self, data: dict[str, Any]) -> tuple[int, Any]:
        self._abort_matching(data.get("rid") or "", bool(data.get("abort_all")))
        return 200, None

    def _abort_matching(self, prefix: str, everything: bool) -> None:
        for run in [*self._running.values(), *self._waiting.values()]:
            if everything or (prefix and run.rid.startswith(prefix)):
                run.aborted.set()

    async def _pause(self, data: dict[str, Any]) -> tuple[int, Any]:
        self._unpaused = anyio.Event()
        if data.get("mode", "abort") == "abort":
            if self._running:
                self._abort_window_until = time.monotonic() + self.pause_abort_window_s
            self._abort_matching("", True)
        return 200, {"message": "Generation paused successfully.", "status": "ok"}

    async def _continue(self, data: Any) -> tuple[int, Any]:
        self._unpaused.set()
        return 200, {"message": "Generation continued successfully.", "status": "ok"}

    async def _release(self, data: dict[str, Any]) -> tuple[int, Any]:
        self.released_tags |= set(data.get("tags") or ("weights", "kv_cache", "cuda_graph"))
        return 200, None

    async def _resume(self, data: dict[str, Any]) -> tuple[int, Any]:
        self.released_tags -= set(data.get("tags") or self.released_tags)
        return 200, None

    async def _update_from_disk(self, data: dict[str, Any]) -> tuple[int, Any]:
        path = str(data.get("model_path") or "")
        if not os.path.isdir(path):  # as SGLang, which keeps serving the old weights
            return 400, {"success": False, "message": f"Failed to get weights iterator: no directory {path}"}
        return await self._update_weights(data)

    async def _update_weights(self, data: dict[str, Any]) -> tuple[int, Any]:
        if self.fail_weight_updates:
            return 400, {"success": False, "message": "Failed to update weights (injected)"}
        current = self.weight_version
        bumped = str(int(current) + 1) if current.isdigit() else "1"
        self.weight_version = str(data.get("weight_version") or bumped)
        return 200, {"success": True, "message": "Succeeded to update model weights."}

    async def _init_group(self, data: dict[str, Any]) -> tuple[int, Any]:
        return 200, {"success": True, "message": "Succeeded to initialize the group."}

    async def _server_info(self, data: Any) -> tuple[int, Any]:
        return 200, {
            "model_path": self.model_path,
            "tp_size": self.tp_size,
            "weight_version": self.weight_version,
            "version": "0.0.0-fake",
        }

    async def _weight_version(self, data: Any) -> tuple[int, Any]:
        return 200, {"weight_version": self.weight_version}

    async def _model_info(self, data: Any) -> tuple[int, Any]:
        return 200, {"model_path": self.model_path, "weight_version": self.weight_version}


_ROUTES = {
    "/health_generate": FakeSGLangServer._health,
    "/health": FakeSGLangServer._health,
    "/flush_cache": FakeSGLangServer._flush,
    "/abort_request": FakeSGLangServer._abort,
    "/pause_generation": FakeSGLangServer._pause,
    "/continue_generation": FakeSGLangServer._continue,
    "/release_memory_occupation": FakeSGLangServer._release,
    "/resume_memory_occupation": FakeSGLangServer._resume,
    "/update_weights_from_disk": FakeSGLangServer._update_from_disk,
    "/update_weights_from_tensor": FakeSGLangServer._update_weights,
    "/update_weights_from_distributed": FakeSGLangServer._update_weights,
    "/init_weights_update_group": FakeSGLangServer._init_group,
    "/get_server_info": FakeSGLangServer._server_info,  # deprecated in SGLang 0.5.17, still served
    "/server_info": FakeSGLangServer._server_info,
    "/get_weight_version": FakeSGLangServer._weight_version,
    "/model_info": FakeSGLangServer._model_info,
}


def _split_header(line: str) -> tuple[str, str]:
    name, _, value = line.partition(":")
    return name.strip().lower(), value.strip()


def _response(status: int, payload: Any, keep_alive: bool) -> bytes:
    if payload is None:
        body = b"null" if status == 200 else b""
        ctype = "application/json"
    elif isinstance(payload, str):
        body, ctype = payload.encode(), "text/plain; charset=utf-8"
    else:
        body, ctype = orjson.dumps(payload), "application/json"
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
        f"content-type: {ctype}\r\ncontent-length: {len(body)}\r\n"
        f"connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode("latin-1") + body
