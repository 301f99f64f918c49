"""The embedded engine's config and its statistics (`rl.engine.embedded`).

What it is: `EmbeddedEngineConfig` (device, dtype, batching and prefill limits of the engine) and
`EngineStats` (its counters, as `EmbeddedEngine.statistics()` reports them). What it is not:
behaviour; both are plain Structs.
"""

from __future__ import annotations

from msgspec import Struct


class EmbeddedEngineConfig(Struct, frozen=True, kw_only=True):
    """Where the model runs and how requests are batched."""

    device: str = "auto"
    """"cuda", "cuda:1", "cpu", or "auto" (CUDA when available)."""
    dtype: str = "auto"
    """Model dtype: "auto" (bfloat16 on CUDA, float32 on CPU), "bfloat16", "float16", "float32"."""
    attn_implementation: str = "sdpa"
    """transformers attention backend for models built here (padding masks need sdpa or eager)."""
    max_batch_size: int = 64
    """Rows decoding together."""
    max_batch_tokens: int = 524288
    """KV slots of the padded batch in the worst case: rows x longest (prompt + max_new_tokens)."""
    max_prefill_tokens: int = 16384
    """Padded tokens per prefill forward: rows are prefilled in groups, and prompts wider than
    this in chunks of columns, so a long prompt never builds a huge attention mask."""
    batch_wait_ms: float = 5.0
    """How long an idle scheduler waits to gather concurrent requests into the first batch."""
    max_context_tokens: int = 32768
    """Prompt plus output; a request hitting it ends with finish_reason "length"."""
    avoid_cudnn_attention: bool = True
    """Exclude cuDNN from SDPA during engine forwards: it builds a plan per new KV length
    (Qwen2-0.5B shape, H200, torch 2.11: 55 -> 14 ms per decode step at 1 row, 82 -> 18 ms at
    64). The backend flags are process-wide while an engine forward runs."""
    decode_chunk_steps: int = 16
    """Decode steps per worker-thread hop (fewer when a row finishes)."""
    static_decode: bool = False
    """Decode a batch whose rows do not change over preallocated KV buffers at fixed shapes
    (`rl.engine.static_decode`; Llama and Qwen2 families): rows padded to a power of two, KV
    columns to a power of two. Rows joining or finishing still go through transformers' forward."""
    cuda_graphs: bool = True
    """With `static_decode` on a GPU: capture each fixed shape's step as a CUDA graph and replay it
    (a small model's decode step is launch-bound)."""
    max_queued_requests: int = 4096
    """Requests waiting for a batch; `generate` blocks beyond that."""


class EngineStats(Struct, frozen=True, kw_only=True):
    """Counters since the engine was made."""

    requests: int  # finished requests, any reason
    aborted: int
    queued: int
    running: int
    prompt_tokens: int
    tokens_generated: int
    batches: int  # prefill forwards
    decode_steps: int
    mean_batch_size: float  # live rows per decode step
    max_batch_size: int
    tokens_per_s: float  # generated tokens per second of generation work
    busy_fraction: float  # generation work / time serving
    weight_version: int
    paused: bool
    holds: tuple[str, ...]  # why admission is held: pause, weights, memory


__all__ = ["EmbeddedEngineConfig", "EngineStats"]
