"""LLM composition: the policy engine writes a Model that chains given seed operators.

What it is: for a seed index, a deterministic pick of 1-5 seed operators (depth drawn like
`compose.DEPTH_WEIGHTS`), a prompt asking for one KernelBench-format module that applies them in
sequence (the CUDA Agent paper had an LLM compose up to 5 torch operator classes: data synthesis),
one `generate` on any `agentcore.engine.Engine` (SGLang client, router, embedded engine,
ScriptedEngine in tests), and the reply parsed and validated: the python code block extracted,
parsed, `Model` / `get_inputs` / `get_init_inputs` defined, optionally run on CPU in a child
process (`loaders.check_runs`, for small sizes only; full-size tasks go through the GPU filters).
What it is not: the filters or decontamination (`synth` runs those on every candidate). A bad
reply is a `Composition` with a rejection `reason` ("no_code", "truncated", "syntax_error",
"missing_definitions", "does_not_run"); only a broken engine raises (EngineError).

Example:
    chat = ChatRenderer(tokenizer, [], "hermes")
    c = await llm_compose(engine, chat, 17)
    c.task.source if c.task else c.reason
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Sequence
from typing import Protocol

import anyio
from msgspec import Struct

from agentcore.engine import Engine, SamplingParams
from agentcore.tasks import check_source
from agentcore.types import Message, Task
from rl.data.compose import DEPTH_WEIGHTS
from rl.data.loaders import check_runs
from rl.data.seeds import BASE_SHAPES, SeedOp, seed_ops

SYSTEM = "You are an expert PyTorch engineer who writes small, self-contained benchmark modules."

INSTRUCTIONS = """Write one Python module in KernelBench format that applies these PyTorch operators in sequence, \
each one's output feeding the next:
{ops}

Rules:
- `class Model(nn.Module)` with `__init__` taking only plain Python values and `forward(self, ...)` \
returning one tensor; put every learnable layer in `__init__`.
- Module-level size constants, `def get_inputs()` returning a list of input tensors made with \
`torch.rand` or `torch.randn`, and `def get_init_inputs()` returning the constructor arguments.
- Pick shapes so that one eager forward takes 1-100 ms on a datacenter GPU (inputs of about \
{elements} elements, e.g. {example}); add a reshape, permute or flatten only where an operator needs it.
- No randomness in forward (no dropout, no torch.rand), no Python loops over elements, no I/O.

Reply with the module in a single ```python code block."""

_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


class Prompter(Protocol):
    """What llm_compose needs from a chat renderer (`agentcore.chat.ChatRenderer` is one)."""

    stop_token_ids: tuple[int, ...]

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]: ...

    def assistant_text(self, generated_ids: Sequence[int]) -> str: ...


class LlmComposeConfig(Struct, frozen=True, kw_only=True):
    """How the engine is asked and how its reply is checked."""

    max_depth: int = 5
    """Most operators requested in one prompt."""
    max_new_tokens: int = 2048
    """Reply budget; a reply cut off before its code block closes is "truncated"."""
    temperature: float = 0.7
    """Sampling temperature (data generation, not a rollout: no need for temperature 1)."""
    top_p: float = 0.95
    """Nucleus sampling."""
    run_on_cpu: bool = False
    """Also run the Model on CPU in a child process (only for small sizes)."""
    run_timeout_s: float = 60.0
    """Budget of that CPU run."""


class Composition(Struct, frozen=True, kw_only=True):
    """One LLM composition: the task, or why there is none, and what was asked."""

    rng_seed: int
    requested: tuple[str, ...]
    task: Task | None = None
    reason: str = ""
    message: str = ""
    completion_tokens: int = 0


def pick_ops(rng_seed: int, max_depth: int = 5, ops: tuple[SeedOp, ...] | None = None) -> tuple[SeedOp, ...]:
    """The operators asked for at `rng_seed`: a depth drawn like programmatic compositions, then ops."""
    ops = ops if ops is not None else seed_ops()
    rng = random.Random(f"llm:{rng_seed}")
    depths = [d for d in DEPTH_WEIGHTS if d <= max_depth]
    depth = rng.choices(depths, weights=[DEPTH_WEIGHTS[d] for d in depths])[0]
    return tuple(rng.choice(ops) for _ in range(depth))


def prompt_messages(ops: Sequence[SeedOp]) -> list[Message]:
    listing = "\n".join(f"{i}. {op.name} ({op.family}), e.g. `{op.template.format(x='x', C=64, L=4096, G=8, H=2048, C2=32)}`"
                        for i, op in enumerate(ops, start=1))
    rank = max((r for r in ops[0].ranks if r in BASE_SHAPES), default=4)
    example = "[" + ", ".join(map(str, BASE_SHAPES[rank])) + "]"
    user = INSTRUCTIONS.format(ops=listing, elements="1e8", example=example)
    return [Message(role="system", content=SYSTEM), Message(role="user", content=user)]


def extract_code(text: str) -> str | None:
    """The longest fenced code block of the reply (reasoning in <think> ignored), or None."""
    blocks = _BLOCK.findall(_THINK.sub("", text))
    return max(blocks, key=len).strip() + "\n" if blocks else None


def validate(source: str) -> tuple[str, str] | None:
    """(reason, message) when `source` is not a KernelBench-format module, else None."""
    try:
        ast.parse(source)
    except SyntaxError as exc:
        return "syntax_error", f"line {exc.lineno}: {exc.msg}"
    why = check_source(source)
    return ("missing_definitions", why) if why else None


async def llm_compose(engine: Engine, chat: Prompter, rng_seed: int, *, config: LlmComposeConfig = LlmComposeConfig(),
                      ops: tuple[SeedOp, ...] | None = None) -> Composition:
    """Ask `engine` for the composition of `pick_ops(rng_seed)`; the reply parsed and validated."""
    picked = pick_ops(rng_seed, config.max_depth, ops)
    names = tuple(op.name for op in picked)
    params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p,
                            stop_token_ids=chat.stop_token_ids, seed=rng_seed)
    gen = await engine.generate(chat.prompt_ids(prompt_messages(picked)), params, session_id=f"llm/{rng_seed}")
    text = chat.assistant_text(gen.token_ids)
    base = Composition(rng_seed=rng_seed, requested=names, completion_tokens=len(gen.token_ids))
    code = extract_code(text)
    if code is None:
        reason = "truncated" if gen.finish_reason == "length" else "no_code"
        return _rejected(base, reason, text[-300:])
    if (bad := validate(code)) is not None:
        return _rejected(base, *bad)
    meta = {"source": "llm", "ops": ",".join(names), "families": ",".join(op.family for op in picked),
            "depth": len(picked), "rng_seed": rng_seed, "completion_tokens": len(gen.token_ids)}
    task = Task(task_id=f"llm/{rng_seed}", source=code, name="_".join(n.split(".")[-1] for n in names), metadata=meta)
    if config.run_on_cpu:
        why = await anyio.to_thread.run_sync(check_runs, task, config.run_timeout_s)
        if why is not None:
            return _rejected(base, "does_not_run", why)
    return Composition(rng_seed=rng_seed, requested=names, task=task, completion_tokens=len(gen.token_ids))


def _rejected(base: Composition, reason: str, message: str) -> Composition:
    return Composition(rng_seed=base.rng_seed, requested=base.requested, reason=reason, message=message,
                       completion_tokens=base.completion_tokens)
