"""A scripted policy: an Engine that plays given assistant messages instead of sampling.

What it is: the engine behind demonstrations (hand-written solutions driven through the real
tools, for rejection fine-tuning), the replay policy of the benchmark, and the fake engine of
the orchestrator benchmark. Each session (trajectory) gets turn i's text from `script(session,
i)`, tokenized with the real tokenizer and closed with the end-of-turn token, with latency.
What it is not: a model. Its log-probs are a constant placeholder (`logprob`), so trajectories
it produces are for supervised use or measurement, never for importance ratios.

Example:
    engine = ScriptedEngine(script=lambda session, turn: texts[turn], encode=tok.encode,
                            end_ids=[im_end_id], latency_s=0.5)
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import anyio

from agentcore.engine import Generation, SamplingParams


class ScriptedEngine:
    def __init__(
        self,
        *,
        script: Callable[[str, int], str],
        encode: Callable[[str], list[int]],
        end_ids: Sequence[int],
        latency_s: float = 0.0,
        logprob: float = 0.0,
        weight_version: int = 0,
    ):
        self.script, self.end_ids, self.latency_s = script, list(end_ids), latency_s
        self.logprob, self.weight_version = logprob, weight_version
        self._encode = functools.lru_cache(maxsize=4096)(lambda text: tuple(encode(text)))
        self._turns: dict[str, int] = {}
        self.requests = 0

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, *, session_id: str
    ) -> Generation:
        turn = self._turns.get(session_id, 0)
        self._turns[session_id] = turn + 1
        self.requests += 1
        if self.latency_s:
            await anyio.sleep(self.latency_s)
        ids = list(self._encode(self.script(session_id, turn))) + self.end_ids
        finish = "stop"
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], "length"
        return Generation(
            token_ids=ids,
            logprobs=[self.logprob] * len(ids),
            finish_reason=finish,
            weight_version=self.weight_version,
            prompt_tokens=len(input_ids),
        )

    def forget(self, session_id: str) -> None:
        """Drop a finished session's turn counter."""
        self._turns.pop(session_id, None)
