"""One agent trajectory: generate -> parse -> run tools -> append, until it ends.

What it is: the inner loop of the system, for exactly one (task, sample). It keeps every token
the model was shown and produced, with the behaviour log-probs of the sampled ones, by appending
only new tokens each turn (never re-rendering the chat: see `agentcore.chat`).
What it is not: concurrency (the orchestrator runs many of these), scoring (the final evaluation
of the workspace happens after it returns) or tool implementations (`agentcore.tools`).

A trajectory ends when the model calls `finish` (completed), the turn limit or the context
budget is spent (truncated), the wall budget is spent (timeout), the model writes too many
invalid calls in a row (parse error), the engine is gone (engine error), or the orchestrator
aborts it (aborted). Each of these is a status on the returned Trajectory, not an exception.

Example:
    runner = RolloutRunner(engine=engine, renderer=renderer, parser=get_parser("hermes"),
                           config=RolloutConfig(max_turns=20))
    traj = await runner.run(task, toolbox, ids=RolloutIds(...))
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import Callable, Protocol, Sequence

import anyio
from msgspec import Struct

from agentcore.engine import Engine, EngineError, Generation, SamplingParams
from agentcore.types import (
    Finish,
    Message,
    Status,
    Task,
    Timings,
    ToolCall,
    ToolError,
    ToolErrorKind,
    ToolResult,
    Trajectory,
    Turn,
)

log = logging.getLogger(__name__)


class RolloutConfig(Struct, frozen=True, kw_only=True):
    max_turns: int = 150
    """Turn limit: 150 in training, 200 in evaluation (the paper)."""
    max_context_tokens: int = 131072
    """Prompt plus everything appended; 128k for agentic RL (the paper)."""
    max_new_tokens: int = 8192
    """Cap on one model turn."""
    wall_budget_s: float = 3600.0
    """Whole-trajectory wall-clock budget."""
    max_invalid_calls: int = 3
    """Consecutive turns with no valid tool call before the trajectory ends as a parse error."""
    tool_timeout_s: float = 900.0
    """Upper bound on one tool call (compile/verify/profile wait on shared pools)."""
    temperature: float = 1.0
    """Sampling temperature, with no top-p/top-k so behaviour log-probs are those of the whole
    distribution. The learner's PPO policy is softmax(logits / temperature) at this temperature
    (below 1: fewer low-probability slips in the samples a step learns from)."""
    top_p: float = 1.0
    """Nucleus sampling; keep 1.0 for RL."""
    top_k: int = -1
    """Top-k sampling; -1 keeps all tokens."""
    seed: int | None = None
    """Base sampling seed; None samples freely. Each trajectory (group, sample) gets its own block
    of seeds from it (`turn_seed`), so the samples of a group differ and a rerun samples alike."""
    tokenizer_threads: int = 2
    """Worker threads that tokenize tool observations off the event loop."""


TURN_STRIDE = 10_000
"""Seeds per trajectory block: turn t of a trajectory samples with its block start + t."""


def turn_seed(base: int, group_id: str, sample_index: int, turn: int) -> int:
    """The sampling seed of one turn of trajectory (group_id, sample_index)."""
    block = zlib.crc32(f"{group_id}/{sample_index}".encode()) % 100_000
    return base + block * TURN_STRIDE + turn


class RolloutIds(Struct, frozen=True, kw_only=True):
    trajectory_id: str
    group_id: str
    sample_index: int


class Renderer(Protocol):
    """What the loop needs of `agentcore.chat.ChatRenderer`."""

    stop_token_ids: Sequence[int]

    def prompt_ids(self, messages: list[Message]) -> list[int]: ...

    def close_turn(self, generated_ids: Sequence[int], finish_reason: str) -> list[int]: ...

    def observation_ids(self, messages: list[Message]) -> list[int]: ...

    def assistant_text(self, generated_ids: Sequence[int]) -> str: ...


class Parser(Protocol):
    def parse(self, text: str): ...


class Tools(Protocol):
    async def run(self, call: ToolCall) -> ToolResult: ...

    def render(self, result: ToolResult) -> str: ...


SYSTEM_PROMPT = (
    "You are an expert CUDA engineer working in a workspace through tools. "
    "Read SKILL.md first and follow it. Call `finish` when you are done."
)


def first_messages(task: Task, skill: str | None = None) -> list[Message]:
    """The opening system and user messages for a task."""
    user = (
        f"Task `{task.task_id}`: write CUDA kernels that make `ModelNew` in model_new.py "
        "compute what `Model` in model.py computes, faster than torch.compile.\n\n"
        f"model.py:\n```python\n{task.source}\n```"
    )
    if skill:
        user += f"\n\nSKILL.md:\n{skill}"
    return [Message(role="system", content=SYSTEM_PROMPT), Message(role="user", content=user)]


class _Tokens:
    """The growing response: ids, behaviour log-probs and the loss mask, kept parallel."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.mask: list[int] = []

    def add_generated(self, gen: Generation) -> None:
        self.ids.extend(gen.token_ids)
        self.logprobs.extend(gen.logprobs)
        self.mask.extend([1] * len(gen.token_ids))

    def add_context(self, ids: Sequence[int]) -> None:
        self.ids.extend(ids)
        self.logprobs.extend([0.0] * len(ids))
        self.mask.extend([0] * len(ids))


class _Episode:
    """Mutable state of one running trajectory; frozen into a Trajectory at the end."""

    def __init__(self, task: Task, ids: RolloutIds, prompt_ids: list[int]) -> None:
        self.task, self.ids, self.prompt_ids = task, ids, prompt_ids
        self.tokens = _Tokens()
        self.turns: list[Turn] = []
        self.status = Status.TRUNCATED_TURNS
        self.error: str | None = None
        self.invalid_streak = 0
        self.versions: list[int] = []
        self.gen_s = self.tool_s = 0.0
        self.start = time.perf_counter()

    def context_len(self) -> int:
        return len(self.prompt_ids) + len(self.tokens.ids)

    def freeze(self) -> Trajectory:
        versions = self.versions or [-1]
        return Trajectory(
            trajectory_id=self.ids.trajectory_id,
            task_id=self.task.task_id,
            group_id=self.ids.group_id,
            sample_index=self.ids.sample_index,
            prompt_ids=self.prompt_ids,
            response_ids=self.tokens.ids,
            logprobs=self.tokens.logprobs,
            loss_mask=self.tokens.mask,
            turns=self.turns,
            status=self.status,
            weight_version_min=min(versions),
            weight_version_max=max(versions),
            timings=Timings(
                generate_s=self.gen_s,
                tools_s=self.tool_s,
                total_s=time.perf_counter() - self.start,
            ),
            error=self.error,
        )


class RolloutRunner:
    """Runs trajectories with one engine, renderer, parser and config (shared, stateless)."""

    def __init__(
        self,
        *,
        engine: Engine,
        renderer: Renderer,
        parser: Parser,
        config: RolloutConfig,
        opening: Callable[[Task], list[Message]] = first_messages,
    ):
        self.engine, self.renderer, self.parser, self.config = engine, renderer, parser, config
        self.opening = opening  # the first messages of a task (the single-turn stage has its own)
        self._tokenizer_threads = anyio.CapacityLimiter(config.tokenizer_threads)

    async def run(
        self,
        task: Task,
        tools: Tools,
        ids: RolloutIds,
        *,
        messages: list[Message] | None = None,
        abort: anyio.CancelScope | None = None,
    ) -> Trajectory:
        """Run one trajectory to its end. `abort`, when cancelled by the caller, ends it as
        ABORTED with everything produced so far."""
        prompt = self.renderer.prompt_ids(messages or self.opening(task))
        ep = _Episode(task, ids, prompt)
        abort = abort or anyio.CancelScope()
        with abort:
            with anyio.move_on_after(self.config.wall_budget_s) as budget:
                await self._loop(ep, tools)
            if budget.cancelled_caught:
                ep.status = Status.TIMEOUT
        if abort.cancelled_caught:
            ep.status = Status.ABORTED
        return ep.freeze()

    async def _loop(self, ep: _Episode, tools: Tools) -> None:
        for index in range(self.config.max_turns):
            budget = self.config.max_context_tokens - ep.context_len()
            if budget <= 0:
                ep.status = Status.TRUNCATED_LENGTH
                return
            try:
                gen, gen_s = await self._generate(ep, index, budget)
            except EngineError as exc:
                ep.status, ep.error = Status.ENGINE_ERROR, str(exc)
                return
            done = await self._turn(ep, tools, index, gen, gen_s)
            if done:
                return
        ep.status = Status.TRUNCATED_TURNS

    async def _generate(self, ep: _Episode, index: int, budget: int) -> tuple[Generation, float]:
        c = self.config
        params = SamplingParams(
            max_new_tokens=min(c.max_new_tokens, budget),
            temperature=c.temperature,
            top_p=c.top_p,
            top_k=c.top_k,
            stop_token_ids=tuple(self.renderer.stop_token_ids),
            seed=None if c.seed is None else turn_seed(c.seed, ep.ids.group_id, ep.ids.sample_index, index),
        )
        t0 = time.perf_counter()
        gen = await self.engine.generate(
            ep.prompt_ids + ep.tokens.ids, params, session_id=ep.ids.trajectory_id
        )
        if len(gen.logprobs) != len(gen.token_ids):
            raise EngineError(
                f"engine returned {len(gen.token_ids)} tokens but {len(gen.logprobs)} logprobs"
            )
        return gen, time.perf_counter() - t0

    async def _turn(
        self, ep: _Episode, tools: Tools, index: int, gen: Generation, gen_s: float
    ) -> bool:
        """Append one turn; returns True when the trajectory is over."""
        gen_start = len(ep.tokens.ids)
        ep.tokens.add_generated(gen)
        gen_end = len(ep.tokens.ids)
        ep.versions.append(gen.weight_version)
        ep.gen_s += gen_s
        text = self.renderer.assistant_text(gen.token_ids)
        parsed = self.parser.parse(text)
        calls: tuple[ToolCall, ...] = tuple(parsed.calls)
        errors = list(parsed.errors)
        out_of_context = ep.context_len() >= self.config.max_context_tokens
        if gen.finish_reason == "length" and not out_of_context:
            errors.append(
                f"Your message was cut off at {len(gen.token_ids)} tokens; "
                "tool calls in it may be incomplete. Write shorter messages."
            )
        if not calls and not errors:
            errors.append("No tool call found. Use a tool, or call `finish` when you are done.")

        t0 = time.perf_counter()
        results, finished = await self._run_calls(tools, calls)
        tool_s = time.perf_counter() - t0
        ep.tool_s += tool_s
        ep.invalid_streak = 0 if results else ep.invalid_streak + 1

        ep.tokens.add_context(self.renderer.close_turn(gen.token_ids, gen.finish_reason))
        over = self._ending(ep, finished, out_of_context)
        if over is None:
            observation = self._observation(tools, calls, results, errors)
            # Tokenizing tool output is the largest CPU cost of a turn; the Rust tokenizer
            # releases the GIL, so a worker thread keeps it off the event loop.
            ids = await anyio.to_thread.run_sync(
                self.renderer.observation_ids, observation, limiter=self._tokenizer_threads
            )
            ep.tokens.add_context(ids)
        ep.turns.append(
            Turn(
                index=index,
                gen_start=gen_start,
                gen_end=gen_end,
                obs_end=len(ep.tokens.ids),
                text=text,
                finish_reason=gen.finish_reason,
                weight_version=gen.weight_version,
                calls=calls[: len(results)],
                results=tuple(results),
                parse_error="\n".join(errors) or None,
                gen_s=gen_s,
                tool_s=tool_s,
            )
        )
        if over is not None:
            ep.status = over
            return True
        return False

    def _ending(self, ep: _Episode, finished: bool, out_of_context: bool) -> Status | None:
        if finished:
            return Status.COMPLETED
        if out_of_context or ep.context_len() >= self.config.max_context_tokens:
            return Status.TRUNCATED_LENGTH
        if ep.invalid_streak >= self.config.max_invalid_calls:
            ep.error = f"{ep.invalid_streak} consecutive turns without a valid tool call"
            return Status.PARSE_ERROR
        return None

    async def _run_calls(
        self, tools: Tools, calls: tuple[ToolCall, ...]
    ) -> tuple[list[ToolResult], bool]:
        """Run calls in order; stop after `finish`. Each call is bounded by tool_timeout_s."""
        results: list[ToolResult] = []
        for call in calls:
            with anyio.move_on_after(self.config.tool_timeout_s) as scope:
                results.append(await tools.run(call))
            if scope.cancelled_caught:
                limit = self.config.tool_timeout_s
                results.append(ToolError(error=ToolErrorKind.TIMEOUT, message=f"tool timed out after {limit:.0f} s"))
            if isinstance(call, Finish):
                return results, True
        return results, False

    @staticmethod
    def _observation(
        tools: Tools, calls: tuple[ToolCall, ...], results: list[ToolResult], errors: list[str]
    ) -> list[Message]:
        messages = [
            Message(role="tool", name=call.__struct_config__.tag, content=tools.render(result))
            for call, result in zip(calls, results)
        ]
        messages.extend(Message(role="tool", name="error", content=e) for e in errors)
        return messages
