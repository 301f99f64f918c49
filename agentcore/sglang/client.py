"""A client for one SGLang server's native HTTP API: token ids in, token ids and log-probs out.

What it is: `SGLangClient` implements `agentcore.engine.Engine` against `/generate` (never text,
never the OpenAI routes) plus the control endpoints a colocated RL step needs (flush, abort,
pause/continue, memory release/resume, weight updates). Field names follow SGLang's
`python/sglang/srt/managers/io_struct.py` and `entrypoints/http_server.py`.
What it is not: a launcher (`launcher.py`) or a load balancer (`router.py`); it imports no torch.

Failure policy: transport errors and 5xx are retried with exponential backoff and jitter until
`max_retries` or `retry_budget_s` is spent, then `EngineError` names the URL. A 400 means the
server refused this request (`RequestRejected`, never retried). A 200 whose finish reason is
`abort` (abort_request, pause_generation) is resumed from the partial output, so the caller sees
one `Generation`; so is a 499, SGLang's answer to a request that waited at a pause's gate while the
pause's repeated abort-all marked it (no tokens). To stop a request on purpose, cancel the awaiting task: httpx closes the
connection and SGLang aborts the request on disconnect.

    async with SGLangClient(SGLangClientConfig(base_url="http://127.0.0.1:30000")) as client:
        gen = await client.generate(prompt_ids, SamplingParams(max_new_tokens=512), session_id="t1")
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any, Literal

import anyio
import httpx
from msgspec import Struct

from agentcore.engine import EngineError, Generation, SamplingParams
from agentcore.sglang import wire

_JSON = {"content-type": "application/json"}


class RequestRejected(EngineError):
    """The server refused this request (HTTP 400): the request is bad, not the server."""


class WeightUpdateError(EngineError):
    """A weight-update endpoint answered `success: false`."""


class SGLangClientConfig(Struct, frozen=True, kw_only=True):
    """How to reach one SGLang server and how hard to try."""

    base_url: str = "http://127.0.0.1:30000"
    """Server root, without a trailing path."""
    request_timeout_s: float = 600.0
    """Read timeout of one /generate attempt (a whole non-streamed generation)."""
    connect_timeout_s: float = 5.0
    """TCP connect timeout of every call."""
    control_timeout_s: float = 120.0
    """Timeout of control calls (flush, abort, pause, memory, server info)."""
    health_timeout_s: float = 30.0
    """Timeout of one /health_generate probe (SGLang itself waits up to 20 s)."""
    weight_update_timeout_s: float = 1800.0
    """Timeout of weight-update calls (loading a large checkpoint takes minutes)."""
    max_retries: int | None = 5
    """Retries of one HTTP exchange after a transport error or a 5xx; None: no count, only
    `retry_budget_s` ends them."""
    retry_budget_s: float = 300.0
    """Stop retrying once this long has passed since the first failure of an exchange (the
    backoff never sleeps past it)."""
    backoff_base_s: float = 0.5
    """First backoff; doubles each retry, with jitter."""
    backoff_max_s: float = 30.0
    """Cap on one backoff sleep."""
    max_resumes: int = 8
    """Re-issues of an aborted generation; past this the partial output is returned as `abort`."""
    max_connections: int = 256
    """Concurrent /generate requests (SGLang slots); control calls get a few extra connections."""


class ClientStatistics(Struct, frozen=True, kw_only=True):
    """Counters since the client was made."""

    requests: int
    retries: int
    resumes: int
    errors: int
    in_flight: int


class ServerInfo(Struct, frozen=True, kw_only=True):
    """`/server_info`: the SGLang version and the raw server args and scheduler info."""

    version: str
    raw: dict[str, Any]


class WeightUpdateResult(Struct, frozen=True, kw_only=True):
    """A successful weight update's answer."""

    message: str = ""
    num_paused_requests: int = 0


class _Retryable(Exception):
    """One failed attempt worth retrying (transport error or 5xx)."""


class SGLangClient:
    """Engine over one SGLang server, with retries, abort resumption and control calls.

    Example:
        client = SGLangClient(SGLangClientConfig(base_url=server.base_url))
        gen = await client.generate([1, 2, 3], SamplingParams(max_new_tokens=64), session_id="s")
        assert len(gen.token_ids) == len(gen.logprobs)
        await client.aclose()
    """

    def __init__(self, config: SGLangClientConfig = SGLangClientConfig()) -> None:
        self.config = config
        self.base_url = config.base_url.rstrip("/")
        timeout = httpx.Timeout(config.request_timeout_s, connect=config.connect_timeout_s)
        limits = httpx.Limits(
            max_connections=config.max_connections + 8,
            max_keepalive_connections=config.max_connections + 8,
        )
        # trust_env=False: a cluster's HTTP(S)_PROXY must not divert traffic to our own servers.
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, limits=limits, trust_env=False
        )
        self._sglang_slots = anyio.CapacityLimiter(config.max_connections)
        self._requests = self._retries = self._resumes = self._errors = self._in_flight = 0
        self._version = 0  # the weight version of the last answer, for pieces that carry none

    async def __aenter__(self) -> SGLangClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._http.aclose()

    def statistics(self) -> ClientStatistics:
        return ClientStatistics(
            requests=self._requests,
            retries=self._retries,
            resumes=self._resumes,
            errors=self._errors,
            in_flight=self._in_flight,
        )

    # -----------------------------------------------------------------------------------------
    # Generation.

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, *, session_id: str
    ) -> Generation:
        """Continue `input_ids` by up to `params.max_new_tokens` tokens, resuming aborts."""
        if params.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {params.max_new_tokens}")
        self._requests += 1
        self._in_flight += 1
        try:
            return await self._generate_resuming(list(input_ids), params, session_id)
        except EngineError:
            self._errors += 1
            raise
        finally:
            self._in_flight -= 1

    async def _generate_resuming(
        self, input_ids: list[int], params: SamplingParams, session_id: str
    ) -> Generation:
        """Re-issue an aborted request with its partial output appended and the remaining
        budget, a bounded number of times; past that the partial output comes back as `abort`."""
        pieces: list[Generation] = []
        tokens: list[int] = []
        for resume in range(self.config.max_resumes + 1):
            if resume:
                self._resumes += 1
                await anyio.sleep(self._backoff_s(resume - 1))
            budget = params.max_new_tokens - len(tokens)
            piece = await self._generate_once(input_ids + tokens, params, budget, session_id)
            pieces.append(piece)
            tokens += piece.token_ids
            if piece.finish_reason != "abort" or wire.finished_anyway(tokens, params):
                break
        return wire.merge_pieces(pieces, params, prompt_tokens=len(input_ids))

    async def _generate_once(
        self, input_ids: list[int], params: SamplingParams, budget: int, session_id: str
    ) -> Generation:
        def payload() -> bytes:  # a fresh rid per attempt: SGLang refuses duplicate rids
            return wire.encoder.encode(wire.generate_payload(input_ids, params, budget, session_id))

        response = await self._exchange("POST", "/generate", payload, retry=True, slots=True)
        if response.status_code == 499:  # aborted while held by a pause: nothing generated
            return Generation(token_ids=[], logprobs=[], finish_reason="abort", weight_version=self._version)
        if response.status_code == 400:
            raise RequestRejected(
                f"SGLang at {self.base_url}/generate refused the request: "
                f"{wire.error_text(response)}"
            )
        wire.expect_status(response, 200, self.base_url)
        gen = wire.parse_generation(response.content, budget, f"{self.base_url}/generate")
        self._version = gen.weight_version
        return gen

    # -----------------------------------------------------------------------------------------
    # HTTP with retries.

    async def _exchange(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        retry: bool,
        timeout_s: float | None = None,
        slots: bool = False,
    ) -> httpx.Response:
        """One logical call; `body` is bytes, a JSON-able object, or a callable making bytes.
        With `slots`, each attempt (not the backoff between them) holds an SGLang slot."""
        started = time.monotonic()
        failing_since: float | None = None
        attempt = 0
        while True:
            try:
                if not slots:
                    return await self._attempt(method, path, body, timeout_s)
                async with self._sglang_slots:
                    return await self._attempt(method, path, body, timeout_s)
            except _Retryable as failure:
                now = time.monotonic()
                failing_since = failing_since if failing_since is not None else now
                left_s = self.config.retry_budget_s - (now - failing_since)
                out_of_retries = self.config.max_retries is not None and attempt >= self.config.max_retries
                if not retry or out_of_retries or left_s <= 0:
                    raise EngineError(
                        f"SGLang at {self.base_url}{path} failed after {attempt + 1} attempt(s) "
                        f"over {now - started:.1f}s: {failure}"
                    ) from failure.__cause__
                await anyio.sleep(min(self._backoff_s(attempt), left_s))
                attempt += 1
                self._retries += 1

    async def _attempt(
        self, method: str, path: str, body: Any, timeout_s: float | None
    ) -> httpx.Response:
        content = body() if callable(body) else body
        if content is not None and not isinstance(content, bytes):
            content = wire.encoder.encode(content)
        timeout: Any = httpx.USE_CLIENT_DEFAULT
        if timeout_s is not None:
            timeout = httpx.Timeout(timeout_s, connect=self.config.connect_timeout_s)
        try:
            response = await self._http.request(
                method, path, content=content, headers=_JSON, timeout=timeout
            )
        except httpx.RequestError as exc:  # transport errors, timeouts, broken encodings
            raise _Retryable(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc
        if response.status_code >= 500:
            raise _Retryable(f"HTTP {response.status_code}: {response.text[:200]}")
        return response

    def _backoff_s(self, attempt: int) -> float:
        cap = min(self.config.backoff_max_s, self.config.backoff_base_s * 2**attempt)
        return cap * random.uniform(0.5, 1.0)

    async def _control(
        self, path: str, body: Any = None, *, timeout_s: float | None = None, retry: bool = True
    ) -> httpx.Response:
        timeout = timeout_s if timeout_s is not None else self.config.control_timeout_s
        return await self._exchange("POST", path, body, retry=retry, timeout_s=timeout)

    # -----------------------------------------------------------------------------------------
    # Control endpoints.

    async def health_generate(self) -> bool:
        """True when the server generated a token within `health_timeout_s` (never raises)."""
        try:
            response = await self._attempt(
                "GET", "/health_generate", None, self.config.health_timeout_s
            )
        except _Retryable:
            return False
        return response.status_code == 200

    async def flush_cache(self) -> bool:
        """Flush the radix cache: True if flushed, False if the server is busy (HTTP 400)."""
        response = await self._control("/flush_cache")
        if response.status_code == 400:
            return False
        wire.expect_status(response, 200, self.base_url)
        return True

    async def abort_request(self, rid: str | None = None, abort_all: bool = False) -> None:
        """Abort the request `rid`, or all. SGLang's scheduler matches rid prefixes, but its
        tokenizer manager (0.5.17, one tokenizer worker) forwards only a whole rid it knows, so
        over HTTP a prefix aborts nothing.
        The client resumes what it sees aborted; to drop a request, cancel its task instead."""
        if rid is None and not abort_all:
            raise ValueError("abort_request needs a rid or abort_all=True")
        body: dict[str, Any] = {"abort_all": abort_all}
        if rid is not None:
            body["rid"] = rid
        await self._post_ok("/abort_request", body)

    async def pause_generation(
        self, mode: Literal["abort", "retract", "in_place"] = "abort"
    ) -> None:
        """Stop scheduling; new requests wait for `continue_generation` (old servers: no mode)."""
        await self._post_ok("/pause_generation", {"mode": mode})

    async def continue_generation(self) -> None:
        await self._post_ok("/continue_generation", {})

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """Free GPU memory: tags among weights, kv_cache, cuda_graph (None: all)."""
        await self._ack("/release_memory_occupation", {"tags": _list_or_none(tags)})

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        await self._ack("/resume_memory_occupation", {"tags": _list_or_none(tags)})

    async def update_weights_from_disk(
        self, model_path: str, weight_version: int | str | None = None
    ) -> WeightUpdateResult:
        body = wire.with_version({"model_path": model_path}, weight_version)
        return await self._weights("/update_weights_from_disk", body)

    async def update_weights_from_tensor(
        self,
        serialized_named_tensors: list[str],
        load_format: str | None = None,
        flush_cache: bool = True,
        weight_version: int | str | None = None,
    ) -> WeightUpdateResult:
        """One serialized payload per TP rank (CUDA IPC handles: trainer and server share GPUs)."""
        body = {
            "serialized_named_tensors": serialized_named_tensors,
            "load_format": load_format,
            "flush_cache": flush_cache,
        }
        body = wire.with_version(body, weight_version)
        return await self._weights("/update_weights_from_tensor", body)

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
    ) -> WeightUpdateResult:
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        return await self._weights("/init_weights_update_group", body)

    async def update_weights_from_distributed(
        self,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        group_name: str = "weight_update_group",
        flush_cache: bool = True,
        weight_version: int | str | None = None,
    ) -> WeightUpdateResult:
        if not len(names) == len(dtypes) == len(shapes):
            raise ValueError("names, dtypes and shapes must have the same length")
        body = {
            "names": list(names),
            "dtypes": list(dtypes),
            "shapes": [list(s) for s in shapes],
            "group_name": group_name,
            "flush_cache": flush_cache,
        }
        return await self._weights(
            "/update_weights_from_distributed", wire.with_version(body, weight_version)
        )

    async def get_server_info(self) -> ServerInfo:
        """`/server_info`; servers older than SGLang 0.5.17 have only `/get_server_info` (which
        0.5.17 still answers, with a deprecation warning in its log at every call)."""
        raw = await self._get_json("/server_info", "/get_server_info")
        return ServerInfo(version=str(raw.get("version", "")), raw=raw)

    async def get_weight_version(self) -> int:
        """The served weight version. SGLang 0.5.17 answers 404 on `/get_weight_version` and
        reports the version in `/model_info`; older servers have only the former."""
        raw = await self._get_json("/get_weight_version", "/model_info")
        return wire.parse_weight_version(raw.get("weight_version"))

    async def _get_json(self, path: str, instead: str) -> dict[str, Any]:
        """GET `path`'s JSON object, or `instead`'s where the server has no `path` (a 404)."""
        timeout_s = self.config.control_timeout_s
        response = await self._exchange("GET", path, retry=True, timeout_s=timeout_s)
        if response.status_code == 404:
            response = await self._exchange("GET", instead, retry=True, timeout_s=timeout_s)
        return wire.json_object(response, self.base_url)

    async def _post_ok(self, path: str, body: dict[str, Any]) -> None:
        wire.expect_status(await self._control(path, body), 200, self.base_url)

    async def _ack(self, path: str, body: dict[str, Any]) -> None:
        """Memory endpoints: 200 with nothing (older) or {success, message} (newer); 400 fails."""
        response = await self._control(path, body)
        ack = wire.decode_ack(response)
        if response.status_code == 200 and (ack is None or ack.success):
            return
        message = (ack.message if ack is not None else "") or wire.error_text(response)
        raise EngineError(f"SGLang at {self.base_url}{path} failed: {message}")

    async def _weights(self, path: str, body: dict[str, Any]) -> WeightUpdateResult:
        # Not retried: once the request may have reached the server a weight update is not
        # idempotent (and a second NCCL group init would hang).
        timeout_s = self.config.weight_update_timeout_s
        response = await self._control(path, body, timeout_s=timeout_s, retry=False)
        ack = wire.decode_ack(response)
        if response.status_code == 200 and ack is not None and ack.success:
            return WeightUpdateResult(
                message=ack.message, num_paused_requests=ack.num_paused_requests or 0
            )
        message = (ack.message if ack is not None else "") or wire.error_text(response)
        raise WeightUpdateError(
            f"SGLang at {self.base_url}{path} failed (HTTP {response.status_code}): {message}"
        )


def _list_or_none(items: Sequence[str] | None) -> list[str] | None:
    return None if items is None else list(items)
