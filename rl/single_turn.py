"""The single-turn warm-up stage's protocol: one response holds the whole solution.

What it is: the opening messages that ask for every file in one reply, and a parser that turns
`<file path="...">...</file>` blocks into WriteFile calls followed by Finish. The orchestrator
then runs exactly the agentic machinery (workspace, tools, final scoring), so the warm-up is
scored by the same environment as agentic PPO (the paper's stage 1).
What it is not: a different rollout loop or a different reward.

Example:
    runner = RolloutRunner(engine=e, renderer=r, parser=SingleTurnParser(), config=cfg,
                           opening=single_turn_messages)
"""

from __future__ import annotations

import re

from agentcore.rollout import SYSTEM_PROMPT
from agentcore.toolparse import ParsedTurn
from agentcore.types import Finish, Message, Task, ToolCall, WriteFile

INSTRUCTIONS = (
    "Reply with the complete solution in this one message; there are no tools. Give every file "
    'as <file path="PATH">CONTENT</file>: `model_new.py` (class ModelNew, same constructor and '
    "parameter names as Model, calling your extension `cuda_ext`), `kernels/NAME.cu` (pure CUDA, "
    "only <cuda_runtime.h>, extern \"C\" launchers) and `kernels/NAME_binding.cpp` (tensor glue "
    "registered with the binding registry). No torch compute ops outside allocation."
)

_FILE = re.compile(r'<file path="([^"\n]{1,200})">\n?(.*?)</file>', re.S)


def single_turn_messages(task: Task) -> list[Message]:
    user = (
        f"Task `{task.task_id}`: write CUDA kernels that make `ModelNew` compute what `Model` in "
        f"model.py computes, faster than torch.compile.\n\nmodel.py:\n```python\n{task.source}\n```"
        f"\n\n{INSTRUCTIONS}"
    )
    return [Message(role="system", content=SYSTEM_PROMPT), Message(role="user", content=user)]


class SingleTurnParser:
    """Files in the reply become WriteFile calls, then Finish; a reply with none is an error."""

    family = "single_turn"

    def parse(self, text: str) -> ParsedTurn:
        files = _FILE.findall(text)
        if not files:
            return ParsedTurn(content=text, errors=('no <file path="..."> blocks in the reply',))
        calls: tuple[ToolCall, ...] = tuple(WriteFile(path=p, content=c) for p, c in files)
        return ParsedTurn(content=_FILE.sub("", text).strip(), calls=(*calls, Finish(summary="single turn")))

    def render_call(self, call: ToolCall) -> str:
        if isinstance(call, WriteFile):
            return f'<file path="{call.path}">\n{call.content}</file>'
        return ""

    def render_turn(self, content: str, calls: tuple[ToolCall, ...]) -> str:
        return "\n".join([content, *(self.render_call(c) for c in calls)]).strip()
