"""The model side of the embedded engine: prefill, decode and weight copies on one device.

What it is: `ModelRunner(model, config)` places a HF causal LM on the engine's device in its
dtype (`rl.learner.models.place_model`: fp32 buffers such as RoPE's `inv_freq` stay fp32) and runs the
model work that `EmbeddedEngine` hands to its worker thread: `prefill(batch, rows)` (left-padded
groups under `max_prefill_tokens`, merged into the running batch), `decode_chunk(batch)` (sample
one token per row per step, retire finished rows), `copy_weights(items)` and `move_weights(device)`.
`counts` holds the batch, token and step counters the engine reports.

What it is not: a scheduler (the engine admits requests, holds the model lock and delivers
results) nor thread-safe: one thread at a time, under the engine's lock.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import inspect
import logging
from typing import Any

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from agentcore.types import FinishReason
from rl.engine.batch import Batch as _Batch
from rl.engine.batch import Request as _Request
from rl.engine.batch import sample
from rl.engine.config import EmbeddedEngineConfig
from rl.engine.static_decode import StaticDecoder, supports
from rl.learner.models import place_model

log = logging.getLogger(__name__)

_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""SDPA backends of decoding (`EmbeddedEngineConfig.avoid_cudnn_attention`): all but cuDNN's."""


def decoding_attention(device: torch.device, avoid_cudnn: bool = True) -> contextlib.AbstractContextManager:
    """The attention backends to decode under: on a GPU all but cuDNN's SDPA (which plans anew for
    every KV length) unless `avoid_cudnn` is off; elsewhere torch's choice."""
    if avoid_cudnn and device.type == "cuda":
        return sdpa_kernel(_SDPA_BACKENDS)
    return contextlib.nullcontext()


class ModelRunner:
    """The engine's model on its device, and the work done with it (module docstring)."""

    def __init__(self, model: PreTrainedModel, config: EmbeddedEngineConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.model = place_model(model, self.device, resolve_dtype(config.dtype, self.device))
        self.model.eval()
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        params = inspect.signature(self.model.forward).parameters
        self.keep_logits = "logits_to_keep" in params
        # transformers renamed `past_key_values` to `cache` (the old name warns that it is deprecated)
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.mergeable = all(type(x) is DynamicLayer for x in self.new_cache().layers)
        self.rng = torch.Generator(device=self.device)
        self.rng.seed()
        self.counts = collections.Counter[str]()
        self.static = (
            StaticDecoder(self.model, device=self.device, graphs=config.cuda_graphs,
                          attention=lambda: decoding_attention(self.device, config.avoid_cudnn_attention))
            if config.static_decode and self.mergeable and supports(self.model) else None
        )


    def new_cache(self) -> Any:
        return DynamicCache(config=self.model.config)

    def forward(self, ids: Tensor, mask: Tensor, positions: Tensor, cache: Any) -> Tensor:
        """Next-token logits [B, V] fp32 after feeding `ids` [B, t] into `cache`."""
        extra = {"logits_to_keep": 1} if self.keep_logits else {}
        extra[self.cache_kwarg] = cache
        with decoding_attention(self.device, self.config.avoid_cudnn_attention):
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **extra,
            )
        return out.logits[:, -1, :].float()

    @torch.inference_mode()
    def prefill(self, batch: _Batch | None, rows: list[_Request]) -> _Batch:
        """Prefill `rows` in groups of at most `max_prefill_tokens` padded tokens (one group
        when caches cannot be merged) and merge them into `batch`."""
        rows = sorted(rows, key=lambda r: len(r.prompt))
        groups: list[list[_Request]] = []
        for req in rows:
            group = groups[-1] if groups else None
            if group is None or (
                self.mergeable
                and (len(group) + 1) * len(req.prompt) > self.config.max_prefill_tokens
            ):
                groups.append(group := [])
            group.append(req)
        for group in groups:
            fresh = self.prefill_group(group)
            if batch is None:
                batch = fresh
            else:
                batch.merge(fresh)
        assert batch is not None
        return batch

    def prefill_group(self, rows: list[_Request]) -> _Batch:
        width = max(len(r.prompt) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)  # [B, T] left-padded
        mask = torch.zeros(len(rows), width, dtype=torch.long)  # [B, T]
        for i, req in enumerate(rows):
            ids[i, width - len(req.prompt) :] = torch.tensor(req.prompt)
            mask[i, width - len(req.prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)  # [B, T], 0 on padding
        cache = self.new_cache()
        chunk = max(1, self.config.max_prefill_tokens // len(rows))  # columns per forward
        for start in range(0, width, chunk):
            end = min(width, start + chunk)
            logits = self.forward(ids[:, start:end], mask[:, :end], positions[:, start:end], cache)
        self.counts["batches"] += 1
        self.counts["prompt_tokens"] += sum(len(r.prompt) for r in rows)
        return _Batch(list(rows), cache, mask, positions[:, -1] + 1, logits)

    @torch.inference_mode()
    def decode_chunk(self, batch: _Batch) -> list[_Request]:
        """Up to `decode_chunk_steps` steps, stopping early when a row finishes."""
        steps = self.config.decode_chunk_steps
        if self.static is not None and batch.mask.shape[1] + steps <= self.config.max_context_tokens:
            return self.static_chunk(batch, steps)
        finished: list[_Request] = []
        for _ in range(steps):
            finished += self.step(batch)
            if finished or not batch.rows:
                break
        return finished

    def static_chunk(self, batch: _Batch, steps: int) -> list[_Request]:
        """`decode_chunk` over the static decoder: while no row finishes, each step is one
        fixed-shape forward (a graph replay on a GPU); the step where rows finish hands the batch
        back to `step`'s retiring and transformers' forward. The static path failing (a capture,
        its buffers' memory) turns it off for this engine: the batch goes on from the last step
        it completed, through transformers' forward."""
        assert self.static is not None
        try:
            self.static.begin(batch, steps)
        except RuntimeError as exc:
            self.static_failed(exc)
            return self.decode_chunk(batch)
        logits, done = batch.logits, 0
        try:
            for _ in range(steps):
                tokens, keep, finished = self.draw(batch, logits)
                if finished:
                    self.static.end(batch, done)
                    self.advance(batch, tokens, keep, finished)
                    return finished
                try:
                    logits = self.static.step(tokens)
                except RuntimeError as exc:
                    self.static.end(batch, done)
                    self.static_failed(exc)
                    self.advance(batch, tokens, keep, [])  # the tokens just drawn, fed the dynamic way
                    return []
                done += 1
                self.counts["static_steps"] += 1
        finally:
            if self.static is not None and self.static.live is not None:
                self.static.end(batch, done)
        return []

    def static_failed(self, exc: RuntimeError) -> None:
        """Turn the static path off for good: a speed path that failed costs speed, not the run."""
        log.error("static decode off for this engine after: %s", str(exc).splitlines()[0][:300])
        self.counts["static_failures"] += 1
        assert self.static is not None
        self.static.release()
        self.static = None

    def step(self, batch: _Batch) -> list[_Request]:
        """Sample one token per row, retire finished rows, feed the rest one token further."""
        tokens, keep, finished = self.draw(batch, batch.logits)
        self.advance(batch, tokens, keep, finished)
        return finished

    def draw(self, batch: _Batch, logits: Tensor) -> tuple[Tensor, list[int], list[_Request]]:
        """Sample one token per row from `logits` and append it; (tokens [B], the rows that go on,
        the rows that finished)."""
        tokens, logprobs = sample(logits, batch.sampling, self.rng)  # [B], [B]
        self.counts["steps"] += 1
        self.counts["row_steps"] += len(batch.rows)
        self.counts["max_rows"] = max(self.counts["max_rows"], len(batch.rows))
        keep: list[int] = []
        finished: list[_Request] = []
        for i, (req, token, logprob) in enumerate(
            zip(batch.rows, tokens.tolist(), logprobs.tolist(), strict=True)
        ):
            req.tokens.append(token)
            req.logprobs.append(logprob)
            req.finish = finish_reason(req, token)
            if req.finish is None:
                keep.append(i)
            else:
                finished.append(req)
        return tokens, keep, finished

    def advance(self, batch: _Batch, tokens: Tensor, keep: list[int], finished: list[_Request]) -> None:
        """Retire `finished` rows, then feed the others' `tokens` through transformers' forward."""
        if finished:
            tokens = tokens[torch.tensor(keep, dtype=torch.long, device=tokens.device)]
            batch.select(keep, self.mergeable)
        if batch.rows:
            batch.mask = torch.nn.functional.pad(batch.mask, (0, 1), value=1)  # [B, T + 1]
            batch.logits = self.forward(
                tokens[:, None], batch.mask, batch.positions[:, None], batch.cache
            )
            batch.positions = batch.positions + 1

    def copy_weights(self, items: list[tuple[str, Tensor]]) -> None:
        targets = dict(self.model.named_parameters())
        targets.update(self.model.named_buffers())
        targets.update(self.model.state_dict(keep_vars=True))  # tied names too (lm_head.weight)
        unknown = [name for name, _ in items if name not in targets]
        if unknown:
            raise ValueError(f"unknown weight names ({len(unknown)}): {unknown[:16]}")
        wrong = [
            f"{name} {tuple(t.shape)} != {tuple(targets[name].shape)}"
            for name, t in items
            if tuple(t.shape) != tuple(targets[name].shape)
        ]
        if wrong:
            raise ValueError(f"weight shapes differ ({len(wrong)}): {wrong[:16]}")
        with torch.no_grad():
            for name, tensor in items:
                targets[name].data.copy_(tensor)  # converts dtype and device

    def move_weights(self, device: str | torch.device | None) -> None:
        if self.static is not None:  # its buffers are KV memory, its graphs hold the weights' addresses
            self.static.release()
        if device is not None:
            self.model.to(device)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def finish_reason(req: _Request, token: int) -> FinishReason | None:
    if token in req.params.stop_token_ids:
        return "stop"
    if len(req.tokens) >= req.budget:
        return "length"
    if req.abort_requested:
        return "abort"
    return None


def resolve_device(name: str) -> torch.device:
    """"auto", "cuda", "cuda:1", "cpu" as a torch.device; a CUDA device always carries its index
    (the current one), since the engine sets it in each worker thread and `set_device` needs one."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


__all__ = ["ModelRunner", "decoding_attention", "finish_reason", "resolve_device", "resolve_dtype"]
