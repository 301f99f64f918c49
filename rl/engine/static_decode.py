"""Decode steps over preallocated KV buffers, replayed as CUDA graphs on a GPU (the embedded engine).

What it is: `StaticDecoder(model, config)` runs the engine's decode steps for a batch whose rows do
not change, with every shape fixed: the batch padded to a power of two rows, the KV columns to a
power of two (at least `MIN_COLUMNS`), the token's column, positions and padding mask held in device
tensors. One step is the model's own modules (embedding, rotary embedding, each decoder layer, final
norm, LM head) called with a 4-D boolean mask and a cache object that writes the step's keys and
values into the buffers. On a GPU each (rows, columns) shape is captured once as a CUDA graph and
replayed: a small model's decode step is launch-bound (SmolLM2-135M, 30 layers, ~29 ms a step over
17 rows through transformers' forward on an H200), and a replay launches the whole step at once.
`begin(batch, steps)` copies the batch's `DynamicCache` into the buffers, `step(tokens)` feeds one
token per row and returns the next logits, `end(batch, steps)` points the batch's cache layers,
mask, positions and logits at the state after `steps` steps (views of the buffers: nothing copied
back). `release()` drops buffers and graphs (the engine frees memory, or moves the weights).
What it is not: the scheduler (rows joining or leaving go through transformers' own forward,
`rl.engine.runner`), nor for every architecture: `supports(model)` names what it runs (Llama and
Qwen2 families without sliding windows; others keep the dynamic path).

Example:
    decoder = StaticDecoder(model, device=torch.device("cuda", 0), graphs=True)
    decoder.begin(batch, steps=16)
    logits = decoder.step(tokens)          # [B, V] fp32
    decoder.end(batch, steps=1)
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel

from rl.engine.batch import Batch

log = logging.getLogger(__name__)

MIN_COLUMNS = 512
"""Fewest KV columns of a captured shape: shorter batches share one graph."""
ARCHITECTURES = ("llama", "qwen2")
"""`config.model_type`s whose decoder layers take (hidden, attention_mask, position_ids, cache,
position_embeddings) and whose attention calls `cache.update(k, v, layer_idx, ...)`."""


def supports(model: PreTrainedModel) -> bool:
    """Whether `StaticDecoder` runs `model`: a Llama- or Qwen2-family causal LM with full attention
    in every layer."""
    cfg = model.config
    if getattr(cfg, "model_type", "") not in ARCHITECTURES or getattr(cfg, "use_sliding_window", False):
        return False
    layer_types = getattr(cfg, "layer_types", None) or ()
    return all(t == "full_attention" for t in layer_types)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class _Columns:
    """The cache a decoder layer's attention writes into: the step's key and value go to column
    `column` of every row; attention reads all `columns` (the mask hides what is not a token)."""

    def __init__(self, keys: list[Tensor], values: list[Tensor], column: Tensor) -> None:
        self.keys, self.values, self.column = keys, values, column

    def update(self, key: Tensor, value: Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        self.keys[layer_idx].index_copy_(2, self.column, key)  # [Bp, H, C, D] <- [Bp, H, 1, D]
        self.values[layer_idx].index_copy_(2, self.column, value)
        return self.keys[layer_idx], self.values[layer_idx]


class _Shape:
    """One (rows, columns) shape: views of the decoder's KV buffers, its own small inputs and
    logits, and on a GPU its captured step."""

    def __init__(self, rows: int, columns: int, keys: list[Tensor], values: list[Tensor], vocab: int,
                 device: torch.device) -> None:
        self.keys = [k[:rows, :, :columns] for k in keys]  # [Bp, H, C, D] views
        self.values = [v[:rows, :, :columns] for v in values]
        self.ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        self.mask = torch.zeros(rows, columns, dtype=torch.bool, device=device)
        self.logits = torch.zeros(rows, vocab, dtype=torch.float32, device=device)
        self.cache = _Columns(self.keys, self.values, self.column)
        self.graph: torch.cuda.CUDAGraph | None = None


class StaticDecoder:
    """Fixed-shape decode steps of one model (module docstring)."""

    def __init__(self, model: PreTrainedModel, *, device: torch.device, graphs: bool,
                 attention: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> None:
        self.model, self.device = model, device
        self.graphs = graphs and device.type == "cuda"
        self.attention = attention  # the context of each forward (the engine's SDPA backends)
        inner = model.model
        self.embed, self.rotary, self.layers, self.norm = inner.embed_tokens, inner.rotary_emb, inner.layers, inner.norm
        self.head = model.get_output_embeddings()
        attn = self.layers[0].self_attn
        cfg = model.config
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(attn, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        params = inspect.signature(self.layers[0].forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.shapes: dict[tuple[int, int], _Shape] = {}
        self.keys: list[Tensor] = []  # per layer [Bmax, H, Cmax, D], grown to the largest shape asked for
        self.values: list[Tensor] = []
        self.pool: Any = None
        self.live: _Shape | None = None
        self.rows = 0
        self.captures = 0

    # -- the step ---------------------------------------------------------------------------------

    def _forward(self, s: _Shape) -> None:
        """One token per row through the model into `s.logits` (graph-capturable: no host sync)."""
        s.mask.index_fill_(1, s.column, True)
        hidden = self.embed(s.ids)  # [Bp, 1, H]
        cos_sin = self.rotary(hidden, s.positions)
        mask = s.mask[:, None, None, :]  # [Bp, 1, 1, C], True: attend
        for layer in self.layers:
            out = layer(hidden, attention_mask=mask, position_ids=s.positions, position_embeddings=cos_sin,
                        use_cache=True, **{self.cache_kwarg: s.cache})
            hidden = out[0] if isinstance(out, tuple) else out
        s.logits.copy_(self.head(self.norm(hidden))[:, -1].float())

    def _run(self, s: _Shape) -> None:
        if not self.graphs:
            with self.attention():
                self._forward(s)
            return
        if s.graph is None:
            self._capture(s)
        assert s.graph is not None
        s.graph.replay()

    def _capture(self, s: _Shape) -> None:
        """Warm the step up on a side stream, then capture it. Both write the current column's key
        and value from whatever `ids` holds; the replay that follows writes them again."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), self.attention():
            self._forward(s)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread of the process (a background checkpoint's copies) may use CUDA meanwhile
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"), self.attention():
            self._forward(s)
        s.graph = graph
        self.captures += 1

    # -- a chunk of steps -----------------------------------------------------------------------

    def begin(self, batch: Batch, steps: int) -> None:
        """Load `batch` (its cache, mask, positions) into the shape that holds `steps` more
        columns; `step` then feeds it."""
        rows, width = len(batch.rows), batch.mask.shape[1]
        key = (_pow2(rows), max(MIN_COLUMNS, _pow2(width + steps)))
        s = self.shapes.get(key)
        if s is None:
            self._reserve(*key, batch.cache.layers[0].keys.dtype)
            s = self.shapes[key] = _Shape(*key, self.keys, self.values, batch.logits.shape[1], self.device)
        for layer, keys, values in zip(batch.cache.layers, s.keys, s.values, strict=True):
            if layer.keys.data_ptr() != keys.data_ptr() or layer.keys.stride() != keys.stride():
                keys[:rows, :, :width].copy_(layer.keys)  # else it is this shape's own view already
                values[:rows, :, :width].copy_(layer.values)
        s.mask.zero_()
        s.mask[:rows, :width] = batch.mask.bool()
        s.positions.zero_()
        s.positions[:rows, 0] = batch.positions
        s.column.fill_(width)
        self.live, self.rows = s, rows

    def step(self, tokens: Tensor) -> Tensor:
        """Feed `tokens` [B] (one per row) and return the next logits [B, V] fp32 (a view that
        the next step overwrites)."""
        s = self.live
        assert s is not None
        s.ids[: self.rows, 0] = tokens
        self._run(s)
        s.column.add_(1)
        s.positions.add_(1)
        return s.logits[: self.rows]

    def end(self, batch: Batch, steps: int) -> None:
        """Give `batch` the state after `steps` steps of this chunk: its cache layers and mask as
        views of the buffers, its positions and the last logits copied."""
        s, rows = self.live, self.rows
        assert s is not None
        width = batch.mask.shape[1] + steps
        if steps:
            for layer, keys, values in zip(batch.cache.layers, s.keys, s.values, strict=True):
                layer.keys, layer.values = keys[:rows, :, :width], values[:rows, :, :width]
            batch.mask = s.mask[:rows, :width].long()
            batch.positions = s.positions[:rows, 0].clone()
            batch.logits = s.logits[:rows].clone()
        self.live = None

    def _reserve(self, rows: int, columns: int, dtype: torch.dtype) -> None:
        """KV buffers of at least `rows` x `columns`; growing them drops every shape (their views
        and graphs hold the old buffers' addresses)."""
        have = (self.keys[0].shape[0], self.keys[0].shape[2]) if self.keys else (0, 0)
        if rows <= have[0] and columns <= have[1]:
            return
        size = (max(rows, have[0]), self.kv_heads, max(columns, have[1]), self.head_dim)
        # zeros, not empty: a masked column's value is multiplied by a zero weight, and 0 * NaN is NaN
        self.keys = [torch.zeros(size, dtype=dtype, device=self.device) for _ in self.layers]
        self.values = [torch.zeros(size, dtype=dtype, device=self.device) for _ in self.layers]
        gib = 2 * sum(k.numel() * k.element_size() for k in self.keys) / 2**30
        # A run's log says the static path is on, and how often its graphs were captured again
        log.info("static decode: KV buffers of %d rows x %d columns (%.2f GiB); %d graphs captured so far",
                 size[0], size[2], gib, self.captures)
        self.shapes.clear()  # a batch whose cache views the old buffers keeps them alive; `begin` copies
        # The allocator frees a graph pool once its last graph is gone, and capturing into the
        # freed pool's handle fails: the next graph starts a pool of its own.
        self.pool = None

    def release(self) -> None:
        """Drop every buffer and graph (the weights may move, or the memory is given back)."""
        self.shapes.clear()
        self.keys, self.values = [], []
        self.pool, self.live = None, None


__all__ = ["ARCHITECTURES", "MIN_COLUMNS", "StaticDecoder", "supports"]
