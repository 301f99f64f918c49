"""rl.data.llm_compose with a ScriptedEngine and the tiny tokenizer: replies parsed and validated,
bad replies recorded as rejection reasons."""

from __future__ import annotations

import pytest

from agentcore.chat import ChatRenderer
from agentcore.scripted import ScriptedEngine
from agentcore.tiny_tokenizer import load_tokenizer
from rl.data.llm_compose import (
    LlmComposeConfig,
    extract_code,
    llm_compose,
    pick_ops,
    prompt_messages,
)

GOOD = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.fc = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x))


batch, features = 8, 32


def get_inputs():
    return [torch.rand(batch, features)]


def get_init_inputs():
    return [features]
"""

REPLIES = {
    "good": f"<think>\nLinear then GELU; ```python\nnot this\n```\n</think>\nHere it is:\n```python\n{GOOD}```\nDone.",
    "no_code": "I would chain a Linear and a GELU.",
    "syntax": "```python\nclass Model(nn.Module:\n    pass\n```",
    "missing": "```python\n" + GOOD.replace("def get_init_inputs", "def init_inputs") + "```",
    "raises": "```python\n" + GOOD.replace("return torch.nn.functional.gelu(self.fc(x))", "return x @ x") + "```",
    "long": "```python\n" + GOOD * 3 + "```",
}


@pytest.fixture(scope="module")
def chat(tiny_tokenizer_dir):
    return ChatRenderer(load_tokenizer(tiny_tokenizer_dir), [], "hermes")


def engine_for(chat: ChatRenderer, reply: str) -> ScriptedEngine:
    return ScriptedEngine(script=lambda session, turn: reply, encode=lambda t: chat.tokenizer.encode(t, add_special_tokens=False),
                          end_ids=chat.stop_token_ids[:1])


async def compose_with(chat, name, config=LlmComposeConfig()):
    return await llm_compose(engine_for(chat, REPLIES[name]), chat, 5, config=config)


async def test_a_good_reply_becomes_a_task_with_provenance(chat):
    c = await compose_with(chat, "good")
    assert c.reason == "" and c.task is not None
    assert c.task.source == GOOD and c.task.task_id == "llm/5"
    assert c.task.metadata["source"] == "llm"
    assert c.task.metadata["ops"] == ",".join(c.requested) and c.task.metadata["depth"] == len(c.requested)
    assert c.completion_tokens > 0


@pytest.mark.parametrize(("name", "reason"), [("no_code", "no_code"), ("syntax", "syntax_error"), ("missing", "missing_definitions")])
async def test_a_bad_reply_is_a_rejection_reason(chat, name, reason):
    c = await compose_with(chat, name)
    assert (c.task, c.reason) == (None, reason)
    assert c.message


async def test_a_reply_cut_by_length_is_truncated(chat):
    c = await compose_with(chat, "long", LlmComposeConfig(max_new_tokens=40))
    assert (c.task, c.reason) == (None, "truncated")


async def test_the_cpu_run_rejects_a_model_that_raises_and_keeps_one_that_runs(chat):
    config = LlmComposeConfig(run_on_cpu=True)
    bad = await compose_with(chat, "raises", config)
    assert bad.reason == "does_not_run" and "RuntimeError" in bad.message
    good = await compose_with(chat, "good", config)
    assert good.task is not None


def test_the_requested_ops_are_deterministic_and_named_in_the_prompt():
    ops = pick_ops(11)
    assert [o.name for o in ops] == [o.name for o in pick_ops(11)]
    assert 1 <= len(ops) <= 5
    assert all(len(pick_ops(s, max_depth=2)) <= 2 for s in range(30))
    text = prompt_messages(ops)[-1].content
    assert all(op.name in text for op in ops) and "get_init_inputs" in text


def test_extract_code_takes_the_longest_block_outside_reasoning():
    assert extract_code(REPLIES["good"]) == GOOD
    assert extract_code("no fences") is None
