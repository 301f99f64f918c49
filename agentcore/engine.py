"""The one interface between trajectories and a policy model: token ids in, token ids out.

An engine is anything with `async generate(input_ids, params, session_id=...)`: the SGLang
client (`agentcore.sglang`), the router over several servers, the embedded transformers engine
of `rl`, and the fakes in tests and benchmarks. Chat rendering happens before the engine; the
engine never sees text.

Failures: an engine raises `EngineError` only when the server is gone for good (after its own
retries); an aborted request is resumed by the engine, not surfaced to the rollout.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from msgspec import Struct

from agentcore.types import FinishReason


class SamplingParams(Struct, frozen=True, kw_only=True):
    """Sampling for one request. Rollouts run at temperature 1 with no top-p/top-k so that the
    behaviour log-probs are those of the policy, not of a truncated distribution."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


class Generation(Struct, frozen=True, kw_only=True):
    """New tokens with their behaviour log-probs, one per token."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    weight_version: int
    prompt_tokens: int = 0
    cached_tokens: int = 0


class EngineError(RuntimeError):
    """The model server cannot serve this request (gone, or failing after all retries)."""


@runtime_checkable
class Engine(Protocol):
    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, *, session_id: str
    ) -> Generation:
        """Continue `input_ids`; `session_id` keeps one trajectory on one server."""
        ...
