"""The embedded generation engine: an in-process transformers causal LM behind `Engine`.

What it is: `EmbeddedEngine` answers `generate(input_ids, params, session_id=...)` from a HF
`AutoModelForCausalLM` held in this process (any architecture). One scheduler task batches
concurrent requests (continuous batching over a transformers `DynamicCache`; details at the
class). Weights are updated in place by the learner (`update_weights`, or buckets through
`begin_update` / `load_bucket` / `end_update`); every `Generation` reports the weight version
that produced all of its tokens, because updates wait for the running batch to drain.

What it is not: a production server (no paged attention or prefix cache: SGLang is that; CUDA
graphs only with `static_decode`, for a batch whose rows do not change) nor an HTTP server
(`rl.engine.server` puts SGLang's protocol in front of it). Parts:
`rl.engine.runner.ModelRunner` (the model on its device: prefill, decode, weight copies),
`rl.engine.static_decode` (fixed-shape decode steps, replayed as CUDA graphs),
`rl.engine.batch` (the running batch, sampling), `rl.engine.config` (config and statistics
Structs); this module is the scheduler and the API.

Example:
    engine = EmbeddedEngine.from_pretrained("/ckpt/qwen2-0.5b", EmbeddedEngineConfig())
    async with engine.running():
        gen = await engine.generate(ids, SamplingParams(max_new_tokens=256), session_id="t1")
        await engine.update_weights(learner_state_items, version=1)
"""

from __future__ import annotations

import collections
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar

import anyio
import msgspec
import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, PreTrainedModel

from agentcore.engine import EngineError, Generation, SamplingParams
from agentcore.sglang.wire import finished_anyway, merge_pieces, rid_prefix
from rl.engine.batch import Batch as _Batch
from rl.engine.batch import Request as _Request
from rl.engine.config import EmbeddedEngineConfig, EngineStats
from rl.engine.runner import ModelRunner, resolve_device, resolve_dtype
from rl.learner.models import pretrained_config
from rl.pretrained import quiet_transformers, resolve_model

MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")
_T = TypeVar("_T")


class EmbeddedEngine:
    """A batching generation engine over an in-process HF causal LM.

    The scheduler gathers waiting requests for `batch_wait_ms`, left-pads and prefills them
    (attention mask, explicit position ids, a `DynamicCache`), then decodes step by step.
    Requests arriving while a batch decodes join it between decode chunks: they are prefilled on
    their own and merged by left-padding the shorter cache. A finished row leaves at once: its
    result is delivered, the batch is compacted and all-padding leading columns are cut. (Caches
    other than plain `DynamicLayer`s, e.g. sliding-window or linear-attention layers, are not
    merged: there new requests wait for the running batch to end.) Log-probs are those of the
    sampled tokens under log_softmax(logits / temperature) in fp32, before top-p/top-k
    truncation: at temperature 1 they are the policy's. Greedy (temperature < 1e-5 or
    top_k == 1) reports log-probs at temperature 1.

    Threads: all model work (prefill, decode chunks, weight copies, offload) runs in worker
    threads through `anyio.to_thread.run_sync`, one at a time under `_model_lock`; the event
    loop only moves requests between the queue and the batch.

    Example:
        engine = EmbeddedEngine.from_hf_config(tiny_config, EmbeddedEngineConfig(device="cpu"))
        async with anyio.create_task_group() as tg:
            await tg.start(engine.serve)
            gen = await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=8), session_id="s")
            engine.pause(); await engine.update_weights(items, version=1); engine.resume()
            tg.cancel_scope.cancel()
    """

    def __init__(
        self, model: PreTrainedModel, config: EmbeddedEngineConfig = EmbeddedEngineConfig()
    ) -> None:
        self.config = config
        self.runner = ModelRunner(model, config)
        self.model, self.device, self.vocab_size = self.runner.model, self.runner.device, self.runner.vocab_size
        self._inbox, self._queue = anyio.create_memory_object_stream[_Request](
            config.max_queued_requests
        )
        self._held: collections.deque[_Request] = collections.deque()  # pulled, not admitted
        self._live: dict[int, _Request] = {}
        self._ids = itertools.count()
        self._batch: _Batch | None = None
        self._model_lock = anyio.Lock()
        self._holds: collections.Counter[str] = collections.Counter()
        self._opened = anyio.Event()
        self._opened.set()
        self._idle = anyio.Event()
        self._idle.set()
        self._released: set[str] = set()
        self._offloaded = False
        self._batches_at_release = -1  # the batch count when memory was last freed
        self._version = 0
        self._serving = self._closed = False
        self._counts = self.runner.counts
        self._busy_s = 0.0
        self._serve_started: float | None = None

    # -----------------------------------------------------------------------------------------
    # Construction.

    @classmethod
    def from_pretrained(
        cls, path: str, config: EmbeddedEngineConfig = EmbeddedEngineConfig()
    ) -> EmbeddedEngine:
        """Load a local HF directory (config.json + safetensors), or a named model of
        `rl.pretrained` (built once from its wheel, then cached)."""
        quiet_transformers()
        device = resolve_device(config.device)
        model = AutoModelForCausalLM.from_pretrained(
            resolve_model(path),
            dtype=resolve_dtype(config.dtype, device),
            attn_implementation=config.attn_implementation,
            local_files_only=True,
        )
        return cls(model, config)

    @classmethod
    def from_hf_config(
        cls,
        hf_config: dict[str, Any],
        config: EmbeddedEngineConfig = EmbeddedEngineConfig(),
        seed: int = 0,
    ) -> EmbeddedEngine:
        """Randomly initialise a model from a config dict (its `model_type` picks the class)."""
        quiet_transformers()
        model_config = pretrained_config(hf_config)
        device = resolve_device(config.device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(
                model_config,
                dtype=resolve_dtype(config.dtype, device),
                attn_implementation=config.attn_implementation,
            )
        return cls(model, config)

    # -----------------------------------------------------------------------------------------
    # Generation.

    async def generate(
        self,
        input_ids: Sequence[int],
        params: SamplingParams,
        *,
        session_id: str,
        rid: str | None = None,
    ) -> Generation:
        """Continue `input_ids`, resuming the request after aborts (Engine protocol)."""
        prompt = list(input_ids)
        pieces: list[Generation] = []
        tokens: list[int] = []
        while True:
            budget = params.max_new_tokens - len(tokens)
            piece = await self.generate_once(
                prompt + tokens,
                msgspec.structs.replace(params, max_new_tokens=budget),
                rid=rid or rid_prefix(session_id) + uuid.uuid4().hex,
            )
            pieces.append(piece)
            tokens += piece.token_ids
            if piece.finish_reason != "abort" or finished_anyway(tokens, params):
                return merge_pieces(pieces, params, prompt_tokens=len(prompt))

    async def generate_once(
        self, input_ids: Sequence[int], params: SamplingParams, *, rid: str | None = None
    ) -> Generation:
        """One request as SGLang serves it: an abort returns the partial output as "abort"."""
        if self._closed:
            raise EngineError("the embedded engine has stopped")
        prompt = list(input_ids)
        self._validate(prompt, params)
        room = self.config.max_context_tokens - len(prompt)
        budget = max(0, min(params.max_new_tokens, room))
        req = _Request(rid or uuid.uuid4().hex, prompt, params, budget)
        req.version = self._version  # updated when it joins a batch
        if params.seed is not None:
            req.generator = torch.Generator(device=self.device)
            req.generator.manual_seed(params.seed)
        key = next(self._ids)
        self._live[key] = req
        try:
            await self._inbox.send(req)
            await req.done.wait()
        finally:
            if not req.done.is_set():  # cancelled: stop spending compute on it
                self._abort(req)
            self._live.pop(key, None)
        if req.error is not None:
            raise req.error
        assert req.finish is not None
        return Generation(
            token_ids=req.tokens,
            logprobs=req.logprobs,
            finish_reason=req.finish,
            weight_version=req.version,
            prompt_tokens=len(prompt),
        )

    def _validate(self, prompt: list[int], params: SamplingParams) -> None:
        if not prompt:
            raise ValueError("input_ids is empty")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise ValueError(f"input_ids outside the vocabulary [0, {self.vocab_size})")
        if params.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {params.max_new_tokens}")
        if params.temperature < 0 or not 0 < params.top_p <= 1:
            raise ValueError(f"bad temperature/top_p: {params.temperature}/{params.top_p}")
        if params.top_k == 0 or params.top_k < -1:
            raise ValueError(f"top_k must be -1 or >= 1, got {params.top_k}")

    # -----------------------------------------------------------------------------------------
    # Control: abort, pause, weights, memory.

    def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        """Abort requests whose rid starts with `rid` (SGLang's prefix rule), or all; return
        how many. Each returns "abort" with its partial output (`generate` resumes it)."""
        if rid is None and not abort_all:
            raise ValueError("abort needs a rid or abort_all=True")
        hits = [
            r
            for r in self._live.values()
            if r.state != "done" and (abort_all or r.rid.startswith(rid or ""))
        ]
        for req in hits:
            self._abort(req)
        return len(hits)

    def _abort(self, req: _Request) -> None:
        if req.state == "queued":  # still in the inbox or held: finish it here
            req.finish, req.state = "abort", "done"
            self._counts["requests"] += 1
            self._counts["aborted"] += 1
            req.done.set()
        elif req.state == "running":  # the model thread ends it at the next step
            req.abort_requested = True

    def pause(self, mode: Literal["abort", "retract", "in_place"] = "abort") -> None:
        """Stop admitting requests until `resume`; "abort" also aborts all in flight, the
        other modes let the running batch finish."""
        if "pause" not in self._holds:
            self._hold("pause")
        if mode == "abort":
            self.abort(abort_all=True)

    def resume(self) -> None:
        if "pause" in self._holds:
            self._unhold("pause")

    @property
    def paused(self) -> bool:
        return "pause" in self._holds

    @property
    def weight_version(self) -> int:
        return self._version

    async def begin_update(self) -> None:
        """Hold admission and wait for the running batch to end; then `load_bucket` may run."""
        self._hold("weights")
        try:
            await self._idle.wait()
        except BaseException:
            self._unhold("weights")
            raise

    async def load_bucket(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Copy tensors into the parameters/buffers of the same HF state-dict names. All names
        and shapes are checked before any copy; a bad one raises ValueError naming it."""
        if not self._holds["weights"]:
            raise RuntimeError("load_bucket outside begin_update/end_update")
        await self._model_call(self.runner.copy_weights, list(named_tensors), busy=False)

    def end_update(self, version: int | None) -> None:
        """Release admission; `version` becomes the weight version (None: keep the old one)."""
        if version is not None:
            self._version = version
        self._unhold("weights")

    async def update_weights(
        self, named_tensors: Iterable[tuple[str, Tensor]], *, version: int
    ) -> None:
        """`begin_update`, `load_bucket`, `end_update` in one call; a failure keeps the version."""
        await self.begin_update()
        ok = False
        try:
            await self.load_bucket(named_tensors)
            ok = True
        finally:
            self.end_update(version if ok else None)

    async def release_memory(self, tags: Iterable[str] | None = None) -> None:
        """Hold admission, wait for the batch to end (freeing its KV cache), empty the CUDA
        cache; with tag "weights" also move the weights to host memory."""
        tags = _tags(tags)
        if not self._released and tags:
            self._hold("memory")
        self._released |= tags
        await self._idle.wait()
        offload = "weights" in tags and not self._offloaded and self.device.type == "cuda"
        if not offload and self._counts["batches"] == self._batches_at_release:
            return  # nothing generated since the last release: nothing to free (gc.collect costs ~0.4 s)
        await self._model_call(self.runner.move_weights, "cpu" if offload else None, busy=False)
        self._offloaded |= offload
        self._batches_at_release = self._counts["batches"]

    async def resume_memory(self, tags: Iterable[str] | None = None) -> None:
        """Undo `release_memory` for `tags`; admission reopens once nothing is released."""
        tags = _tags(tags) & self._released
        if "weights" in tags and self._offloaded:
            await self._model_call(self.runner.move_weights, self.device, busy=False)
            self._offloaded = False
        self._released -= tags
        if tags and not self._released:
            self._unhold("memory")

    def _hold(self, reason: str) -> None:
        if not self._holds:
            self._opened = anyio.Event()
        self._holds[reason] += 1

    def _unhold(self, reason: str) -> None:
        self._holds[reason] -= 1
        if self._holds[reason] <= 0:
            del self._holds[reason]
        if not self._holds:
            self._opened.set()

    def statistics(self) -> EngineStats:
        c = self._counts
        running = sum(r.state == "running" for r in self._live.values())
        serving_s = time.monotonic() - self._serve_started if self._serve_started else 0.0
        return EngineStats(
            requests=c["requests"],
            aborted=c["aborted"],
            queued=sum(r.state == "queued" for r in self._live.values()),
            running=running,
            prompt_tokens=c["prompt_tokens"],
            tokens_generated=c["tokens"],
            batches=c["batches"],
            decode_steps=c["steps"],
            mean_batch_size=c["row_steps"] / c["steps"] if c["steps"] else 0.0,
            max_batch_size=c["max_rows"],
            tokens_per_s=c["tokens"] / self._busy_s if self._busy_s else 0.0,
            busy_fraction=min(1.0, self._busy_s / serving_s) if serving_s else 0.0,
            weight_version=self._version,
            paused=self.paused,
            holds=tuple(sorted(self._holds)),
        )

    # -----------------------------------------------------------------------------------------
    # Lifecycle and scheduling (event loop side).

    @asynccontextmanager
    async def running(self) -> AsyncIterator[EmbeddedEngine]:
        """Serve inside a task group of its own for the duration of the block."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.serve)
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the scheduler until cancelled; pending requests then fail with EngineError."""
        if self._serving or self._closed:
            raise RuntimeError("an EmbeddedEngine serves once")
        self._serving = True
        self._serve_started = time.monotonic()
        try:
            task_status.started()
            while True:
                if self._batch is None:
                    await self._await_work()
                rows = self._admit()
                if rows:
                    self._batch = await self._model_call(self.runner.prefill, self._batch, rows)
                if self._batch is not None:
                    finished = await self._model_call(self.runner.decode_chunk, self._batch)
                    self._deliver(finished)
                    if not self._batch.rows:
                        self._batch = None
                        self._idle.set()
        finally:
            self._shut_down()

    async def _await_work(self) -> None:
        """Until a request waits and admission is open; then gather arrivals for a moment."""
        while True:
            if not self._held:
                self._held.append(await self._queue.receive())
            if not self._holds:
                break
            await self._opened.wait()
        if self.config.batch_wait_ms > 0:
            await anyio.sleep(self.config.batch_wait_ms / 1000)

    def _admit(self) -> list[_Request]:
        """Requests that join now, within the batch's row and KV-slot budgets (FIFO)."""
        if self._holds or (self._batch is not None and not self.runner.mergeable):
            return []
        rows = self._batch.rows if self._batch is not None else []
        count, longest = len(rows), max((r.reserved for r in rows), default=0)
        admitted: list[_Request] = []
        while count < self.config.max_batch_size:
            req = self._next_waiting()
            if req is None:
                break
            if req.state == "done":  # aborted while queued
                continue
            req.version = self._version
            if req.budget == 0:  # the prompt fills the context
                req.finish = "length"
                self._deliver([req])
                continue
            widest = max(longest, req.reserved)
            if count and (count + 1) * widest > self.config.max_batch_tokens:
                self._held.appendleft(req)
                break
            req.state = "running"
            admitted.append(req)
            count, longest = count + 1, widest
        if admitted and self._batch is None:
            self._idle = anyio.Event()
        return admitted

    def _next_waiting(self) -> _Request | None:
        if self._held:
            return self._held.popleft()
        try:
            return self._queue.receive_nowait()
        except anyio.WouldBlock:
            return None

    def _deliver(self, finished: Iterable[_Request]) -> None:
        for req in finished:
            req.state = "done"
            self._counts["requests"] += 1
            self._counts["aborted"] += req.finish == "abort"
            self._counts["tokens"] += len(req.tokens)
            req.done.set()

    def _shut_down(self) -> None:
        self._closed = True
        failure = EngineError("the embedded engine stopped")
        for req in self._live.values():
            if not req.done.is_set():
                req.error, req.state = failure, "done"
                req.done.set()
        self._batch = None
        self._held.clear()
        self._idle.set()

    def _on_device(self, fn: Callable[..., _T], *args: Any) -> _T:
        """The current CUDA device is per thread (a fresh one's is cuda:0): set the engine's."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        return fn(*args)

    async def _model_call(self, fn: Callable[..., _T], *args: Any, busy: bool = True) -> _T:
        """Run `fn` in a worker thread, the only one touching the model."""
        async with self._model_lock:
            started = time.perf_counter()
            try:
                return await anyio.to_thread.run_sync(self._on_device, fn, *args)
            finally:
                if busy:
                    self._busy_s += time.perf_counter() - started


def _tags(tags: Iterable[str] | None) -> set[str]:
    chosen = set(MEMORY_TAGS if tags is None else tags)
    unknown = chosen - set(MEMORY_TAGS)
    if unknown:
        raise ValueError(f"unknown memory tags {sorted(unknown)}; known: {MEMORY_TAGS}")
    return chosen


__all__ = ["MEMORY_TAGS", "EmbeddedEngine", "EmbeddedEngineConfig", "EngineStats", "resolve_device", "resolve_dtype"]
