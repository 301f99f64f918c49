"""SGLang's native HTTP API in front of an `EmbeddedEngine`, for `agentcore.sglang.SGLangClient`.

What it is: `EngineServer` answers the routes the client and the router use (field names
from SGLang's `python/sglang/srt/managers/io_struct.py`): `/generate` token-in/token-out with
output log-probs, `/health`, `/health_generate`, `/server_info` (and the older
`/get_server_info`), `/get_model_info`, `/get_weight_version`, `/flush_cache`, `/abort_request`, `/pause_generation`,
`/continue_generation`, `/release_memory_occupation`, `/resume_memory_occupation` and
`/update_weights_from_disk` (safetensors of a HF directory, loaded in place). The caller may add
routes (the learner adds `/learner/...`) to the same server.
What it is not: a text server (no tokenizer: `text` and string `stop`s are refused), or the
engine's owner: run `engine.serve` and `server.serve` in the same task group.
Differences from SGLang: stop tokens are always kept in `output_ids` (as with `no_stop_trim`),
there is no prefix cache (`cached_tokens` is 0, flushing only checks that the engine is idle),
and weight updates from tensors or NCCL answer `success: false` (the learner in this process
calls `EmbeddedEngine.update_weights` instead).

    server = EngineServer(engine, EngineServerConfig(port=0))
    async with anyio.create_task_group() as tg:
        await tg.start(engine.serve)
        await tg.start(server.serve)
        client = SGLangClient(SGLangClientConfig(base_url=server.url))
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec
from msgspec import Struct
from safetensors.torch import load_file

from agentcore.engine import EngineError, Generation, SamplingParams
from rl.engine.embedded import EmbeddedEngine
from rl.engine.http import Handler, HttpServer, HttpServerConfig

_PAUSE_MODES = ("abort", "retract", "in_place")


class EngineServerConfig(Struct, frozen=True, kw_only=True):
    """Where the engine is served and what it reports about itself."""

    host: str = "127.0.0.1"
    """Interface to bind (no authentication: keep it on loopback or a private network)."""
    port: int = 0
    """TCP port; 0 picks a free one."""
    model_path: str = "embedded"
    """Reported by /get_server_info and /get_model_info."""
    health_timeout_s: float = 20.0
    """/health_generate answers 503 when one token takes longer (SGLang waits 20 s)."""


class _SamplingIn(Struct, kw_only=True):
    """The SGLang sampling fields honoured here; others (skip_special_tokens...) are ignored."""

    max_new_tokens: int = 128  # SGLang's default
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: list[int] | None = None
    stop: str | list[str] | None = None
    sampling_seed: int | None = None


class _GenerateIn(Struct, kw_only=True):
    input_ids: list[int] | None = None
    text: Any = None
    sampling_params: _SamplingIn = msgspec.field(default_factory=_SamplingIn)
    rid: str | None = None
    return_logprob: bool = False


class EngineServer:
    """An `EmbeddedEngine` behind SGLang's native JSON over HTTP/1.1.

    Example:
        server = EngineServer(engine, routes={("POST", "/learner/step"): step})
        await tg.start(server.serve)
        SGLangClient(SGLangClientConfig(base_url=server.url))
    """

    def __init__(
        self,
        engine: EmbeddedEngine,
        config: EngineServerConfig = EngineServerConfig(),
        *,
        routes: Mapping[tuple[str, str], Handler] | None = None,
    ) -> None:
        self.engine = engine
        self.config = config
        self.http = HttpServer(
            {**self._sglang_routes(), **(routes or {})},
            HttpServerConfig(host=config.host, port=config.port),
        )

    @property
    def url(self) -> str:
        return self.http.url

    @property
    def port(self) -> int | None:
        return self.http.port

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        self.http.add_route(method, path, handler)

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve HTTP until cancelled (the engine's scheduler runs separately)."""
        await self.http.serve(task_status=task_status)

    def _sglang_routes(self) -> dict[tuple[str, str], Handler]:
        posts = {
            "/generate": self._generate,
            "/abort_request": self._abort,
            "/pause_generation": self._pause,
            "/continue_generation": self._continue,
            "/release_memory_occupation": self._release,
            "/resume_memory_occupation": self._resume,
            "/update_weights_from_disk": self._update_from_disk,
            "/update_weights_from_tensor": self._unsupported,
            "/update_weights_from_distributed": self._unsupported,
            "/init_weights_update_group": self._unsupported,
        }
        both = {
            "/health": self._health,
            "/health_generate": self._health_generate,
            "/server_info": self._server_info,
            "/get_server_info": self._server_info,
            "/get_model_info": self._model_info,
            "/get_weight_version": self._weight_version,
            "/flush_cache": self._flush,
        }
        routes: dict[tuple[str, str], Handler] = {("POST", p): h for p, h in posts.items()}
        for path, handler in both.items():
            routes[("GET", path)] = routes[("POST", path)] = handler
        return routes

    # -----------------------------------------------------------------------------------------
    # Generation.

    async def _generate(self, body: Any) -> tuple[int, Any]:
        started = time.monotonic()
        try:
            request = msgspec.convert(body, _GenerateIn)
            input_ids, params = _request_params(request)
            rid = request.rid or uuid.uuid4().hex
            gen = await self.engine.generate_once(input_ids, params, rid=rid)
        except (msgspec.ValidationError, ValueError) as exc:
            return 400, {"error": {"message": str(exc)}}
        except EngineError as exc:
            return 503, {"error": {"message": str(exc)}}
        return 200, _generate_answer(rid, gen, request.return_logprob, time.monotonic() - started)

    async def _health(self, body: Any) -> tuple[int, Any]:
        return 200, None

    async def _health_generate(self, body: Any) -> tuple[int, Any]:
        if self.engine.statistics().holds:  # paused or updating on purpose: alive, not probed
            return 200, None
        probe = SamplingParams(max_new_tokens=1, temperature=0.0)
        with anyio.move_on_after(self.config.health_timeout_s):
            try:
                await self.engine.generate_once([0], probe, rid="HEALTH_CHECK")
            except EngineError:
                return 503, None
            return 200, None
        return 503, None

    # -----------------------------------------------------------------------------------------
    # Control.

    async def _abort(self, body: Any) -> tuple[int, Any]:
        rid, abort_all = body.get("rid"), bool(body.get("abort_all"))
        if abort_all or rid:
            self.engine.abort(rid, abort_all=abort_all)
        return 200, None

    async def _pause(self, body: Any) -> tuple[int, Any]:
        mode = body.get("mode", "abort")
        if mode not in _PAUSE_MODES:
            return 400, {"message": f"mode must be one of {_PAUSE_MODES}, got {mode!r}"}
        self.engine.pause(mode)
        return 200, {"message": "Generation paused successfully.", "status": "ok"}

    async def _continue(self, body: Any) -> tuple[int, Any]:
        self.engine.resume()
        return 200, {"message": "Generation continued successfully.", "status": "ok"}

    async def _flush(self, body: Any) -> tuple[int, Any]:
        stats = self.engine.statistics()
        if stats.running or stats.queued:  # SGLang refuses while requests are in flight
            return 400, "Cache not flushed. Please check if there are any pending requests.\n"
        return 200, "Cache flushed.\n"

    async def _release(self, body: Any) -> tuple[int, Any]:
        try:
            await self.engine.release_memory(body.get("tags"))
        except ValueError as exc:
            return 400, {"success": False, "message": str(exc)}
        return 200, {"success": True, "message": "Memory released."}

    async def _resume(self, body: Any) -> tuple[int, Any]:
        try:
            await self.engine.resume_memory(body.get("tags"))
        except ValueError as exc:
            return 400, {"success": False, "message": str(exc)}
        return 200, {"success": True, "message": "Memory resumed."}

    async def _update_from_disk(self, body: Any) -> tuple[int, Any]:
        """Load every *.safetensors file of `model_path` in place, one file per bucket."""
        path = Path(str(body.get("model_path", "")))
        requested = body.get("weight_version")
        if requested is not None and not str(requested).strip().isdigit():
            return 400, {"success": False, "message": f"weight_version {requested!r} is not an int"}
        version = int(requested) if requested is not None else self.engine.weight_version + 1
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
        if not files:
            return 400, {"success": False, "message": f"no *.safetensors under {str(path)!r}"}
        with anyio.CancelScope(shield=True):  # a client timeout must not stop it half-loaded
            await self.engine.begin_update()
            ok = False
            try:
                for file in files:
                    bucket = await anyio.to_thread.run_sync(load_file, str(file))
                    await self.engine.load_bucket(bucket.items())
                ok = True
            except (OSError, ValueError) as exc:
                return 400, {"success": False, "message": f"Failed to update weights: {exc}"}
            finally:
                self.engine.end_update(version if ok else None)
        message = "Succeeded to update model weights."
        return 200, {"success": True, "message": message, "num_paused_requests": 0}

    async def _unsupported(self, body: Any) -> tuple[int, Any]:
        message = (
            "not supported by the embedded engine: use /update_weights_from_disk, or "
            "EmbeddedEngine.update_weights in the learner's process"
        )
        return 400, {"success": False, "message": message}

    async def _server_info(self, body: Any) -> tuple[int, Any]:
        cfg = self.engine.config
        return 200, {
            "version": "embedded",
            "model_path": self.config.model_path,
            "weight_version": str(self.engine.weight_version),
            "max_running_requests": cfg.max_batch_size,
            "max_total_num_tokens": cfg.max_batch_tokens,
            "context_length": cfg.max_context_tokens,
            "internal_states": [msgspec.to_builtins(self.engine.statistics())],
        }

    async def _model_info(self, body: Any) -> tuple[int, Any]:
        return 200, {"model_path": self.config.model_path, "is_generation": True}

    async def _weight_version(self, body: Any) -> tuple[int, Any]:
        return 200, {"weight_version": str(self.engine.weight_version)}


def _request_params(request: _GenerateIn) -> tuple[list[int], SamplingParams]:
    if request.input_ids is None or request.text is not None:
        raise ValueError("this server takes token ids only: send input_ids, not text")
    s = request.sampling_params
    if s.stop:
        raise ValueError("stop strings need a tokenizer: use stop_token_ids")
    params = SamplingParams(
        max_new_tokens=s.max_new_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        stop_token_ids=tuple(s.stop_token_ids or ()),
        seed=s.sampling_seed,
    )
    return request.input_ids, params


def _generate_answer(
    rid: str, gen: Generation, return_logprob: bool, latency_s: float
) -> dict[str, Any]:
    finish: dict[str, Any] = {"type": gen.finish_reason}
    if gen.finish_reason == "stop":
        finish["matched"] = gen.token_ids[-1]
    elif gen.finish_reason == "abort":
        finish["message"] = "Abort before the request finished"
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": len(gen.token_ids),
        "cached_tokens": gen.cached_tokens,
        "weight_version": str(gen.weight_version),
        "e2e_latency": latency_s,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [
            [lp, token, None] for lp, token in zip(gen.logprobs, gen.token_ids, strict=True)
        ]
    return {"output_ids": gen.token_ids, "meta_info": meta}
