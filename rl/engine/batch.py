"""A batch of decoding requests and how its next tokens are drawn (the embedded engine's core).

What it is: `Request` (one request's state, appended to by the model thread), `Sampling` (a
batch's per-row sampling parameters as tensors), `sample` (the exponential race, so a seeded row
draws the same tokens in any batch), and `Batch` (rows decoding together: KV cache, padding mask,
positions, next-token logits; row selection, left padding and merging).
What it is not: the scheduler or any threading (`rl/engine/embedded.py` owns both; a Batch is
touched only in the model thread).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import anyio
import torch
from torch import Tensor

from agentcore.engine import EngineError, SamplingParams
from agentcore.types import FinishReason

GREEDY_TEMPERATURE = 1e-5
"""Below this temperature (or with top_k == 1) a row decodes greedily."""


class Request:
    """One request's state; the model thread appends tokens, the event loop delivers."""

    __slots__ = (
        "rid",
        "prompt",
        "params",
        "budget",
        "tokens",
        "logprobs",
        "finish",
        "version",
        "state",
        "abort_requested",
        "error",
        "done",
        "generator",
    )

    def __init__(self, rid: str, prompt: list[int], params: SamplingParams, budget: int) -> None:
        self.rid, self.prompt, self.params, self.budget = rid, prompt, params, budget
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.finish: FinishReason | None = None
        self.version = 0
        self.state: Literal["queued", "running", "done"] = "queued"
        self.abort_requested = False
        self.error: EngineError | None = None
        self.done = anyio.Event()
        self.generator: torch.Generator | None = None

    @property
    def reserved(self) -> int:
        return len(self.prompt) + self.budget


class Sampling:
    """Per-row sampling parameters of a batch as tensors, rebuilt when its rows change."""

    def __init__(self, rows: Sequence[Request], device: torch.device) -> None:
        ps = [r.params for r in rows]
        self.greedy = torch.tensor(
            [p.temperature < GREEDY_TEMPERATURE or p.top_k == 1 for p in ps], device=device
        )
        temps = [p.temperature if p.temperature >= GREEDY_TEMPERATURE else 1.0 for p in ps]
        self.temperature = torch.tensor(temps, dtype=torch.float32, device=device)  # [B]
        self.top_p = torch.tensor([p.top_p for p in ps], dtype=torch.float32, device=device)
        self.top_k = torch.tensor([p.top_k if p.top_k > 0 else 1 << 30 for p in ps], device=device)
        self.filtered = any(p.top_p < 1.0 or p.top_k > 1 for p in ps)
        self.generators = [r.generator for r in rows]


def sample(logits: Tensor, s: Sampling, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Tokens [B] and their log-probs [B] under log_softmax(logits / temperature), fp32.

    Sampling is the exponential race (argmax of log p - log E, E ~ Exp(1)), so each row's draw
    depends only on its own generator: a seeded request samples the same tokens in any batch.
    """
    logprobs = torch.log_softmax(logits.float() / s.temperature[:, None], dim=-1)  # [B, V]
    candidates = _top_k_top_p(logprobs, s.top_k, s.top_p) if s.filtered else logprobs
    noise = torch.empty_like(logprobs).exponential_(generator=generator)  # [B, V]
    for row, g in enumerate(s.generators):
        if g is not None:
            noise[row].exponential_(generator=g)
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)  # log(0) would turn -inf logits into nan
    tokens = (candidates - noise.log()).argmax(dim=-1)  # [B]
    tokens = torch.where(s.greedy, logits.argmax(dim=-1), tokens)
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


def _top_k_top_p(logprobs: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """`logprobs` [B, V] with tokens outside each row's top-k and top-p nucleus set to -inf."""
    ordered, order = logprobs.sort(dim=-1, descending=True)  # [B, V]
    rank = torch.arange(ordered.shape[-1], device=ordered.device)
    drop = rank[None, :] >= top_k[:, None]
    probs = ordered.exp()
    drop |= (probs.cumsum(dim=-1) - probs) > top_p[:, None]  # keeps the first token always
    ordered = ordered.masked_fill(drop, float("-inf"))
    return torch.empty_like(logprobs).scatter_(-1, order, ordered)


class Batch:
    """Rows decoding together and their device state; touched only in the model thread."""

    def __init__(
        self, rows: list[Request], cache: Any, mask: Tensor, positions: Tensor, logits: Tensor
    ) -> None:
        self.rows = rows
        self.cache = cache  # DynamicCache, [B, H, T, D] per layer
        self.mask = mask  # [B, T] 1 on real tokens, 0 on left padding
        self.positions = positions  # [B] position of each row's next token
        self.logits = logits  # [B, V] fp32, next-token logits
        self.sampling = Sampling(rows, mask.device)

    def select(self, keep: list[int], mergeable: bool) -> None:
        """Keep only rows `keep`; with plain KV layers also cut all-padding leading columns."""
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.rows = [self.rows[i] for i in keep]
        self.cache.batch_select_indices(index)
        self.mask, self.positions = self.mask[index], self.positions[index]
        self.logits = self.logits[index]
        self.sampling = Sampling(self.rows, self.mask.device)
        if mergeable and self.rows:
            used = self.mask.any(dim=0).nonzero()
            start = int(used[0]) if len(used) else 0
            if start:
                self.mask = self.mask[:, start:]
                for layer in self.cache.layers:
                    layer.keys = layer.keys[..., start:, :]
                    layer.values = layer.values[..., start:, :]

    def pad_left(self, width: int) -> None:
        extra = width - self.mask.shape[1]
        if extra <= 0:
            return
        self.mask = torch.nn.functional.pad(self.mask, (extra, 0))
        for layer in self.cache.layers:
            layer.keys = torch.nn.functional.pad(layer.keys, (0, 0, extra, 0))
            layer.values = torch.nn.functional.pad(layer.values, (0, 0, extra, 0))

    def merge(self, other: Batch) -> None:
        """Append `other`'s rows (plain `DynamicLayer` caches only)."""
        width = max(self.mask.shape[1], other.mask.shape[1])
        self.pad_left(width)
        other.pad_left(width)
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([mine.keys, theirs.keys])
            mine.values = torch.cat([mine.values, theirs.values])
        self.rows = self.rows + other.rows
        self.mask = torch.cat([self.mask, other.mask])
        self.positions = torch.cat([self.positions, other.positions])
        self.logits = torch.cat([self.logits, other.logits])
        self.sampling = Sampling(self.rows, self.mask.device)
