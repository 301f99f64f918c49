"""Incremental chat rendering with the tiny tokenizer: the ids built turn by turn equal one full
render of the conversation, truncated turns are closed, and templates that rewrite earlier turns
are caught."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentcore.chat import ChatRenderer, TemplateDriftError
from agentcore.tiny_tokenizer import (
    ADDED_TOKENS,
    SPECIAL_TOKENS,
    build_tiny_tokenizer,
    load_tokenizer,
)
from agentcore.toolparse import get_parser, tool_schemas
from agentcore.types import Bash, Compile, Message, ReadFile, WriteFile

SYSTEM = Message(role="system", content="You write fast CUDA kernels.")
USER = Message(role="user", content="Make model.py faster.")

# Chat templates that rewrite history, in the minimal ChatML form of the tiny template.
_ROLE_LOOP = """{%- for message in messages %}{%- set content = message.content %}
{%- if message.role == 'assistant' and REWRITE and '</think>' in content %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}
{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""
STRIP_PAST_THINK = _ROLE_LOOP.replace("REWRITE", "not loop.last")
STRIP_THINK_BEFORE_LAST_USER = (
    "{%- set ns = namespace(last_user=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}"
    "{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
) + _ROLE_LOOP.replace("REWRITE", "loop.index0 < ns.last_user")  # what Qwen3's template does


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


@pytest.fixture(scope="module")
def chat(tokenizer):
    return ChatRenderer(tokenizer, tool_schemas(), "hermes")


def with_template(tokenizer_dir, template):
    tokenizer = load_tokenizer(tokenizer_dir)
    tokenizer.chat_template = template
    return tokenizer


def sample(chat, text, *, stop=True):
    """Ids a model could have sampled for `text` (the canonical tokenization), plus end of turn."""
    return chat.tokenizer.encode(text, add_special_tokens=False) + ([chat.stop_token_ids[0]] if stop else [])


def run_episode(chat, turns):
    """Build ids turn by turn as the rollout does; return (messages, ids).

    `turns` holds (assistant text, finish reason, observation messages)."""
    messages = [SYSTEM, USER]
    ids = chat.prompt_ids(messages)
    for text, finish, observations in turns:
        generated = sample(chat, text, stop=finish == "stop")
        ids += generated + chat.close_turn(generated, finish)
        messages.append(Message(role="assistant", content=chat.assistant_text(generated)))
        if observations:
            ids += chat.observation_ids(observations)
            messages += observations
    return messages, ids


def render(chat, messages, generation_prompt):
    return chat.tokenizer.apply_chat_template(
        [m.as_dict() for m in messages],
        tools=tool_schemas(),
        add_generation_prompt=generation_prompt,
        tokenize=True,
        return_dict=False,
    )


# ---------------------------------------------------------------------------------------------
# The tiny tokenizer.


def test_tiny_tokenizer_is_cached_by_content(tmp_path):
    first = build_tiny_tokenizer(tmp_path)
    mtime = (first / "tokenizer.json").stat().st_mtime_ns
    assert build_tiny_tokenizer(tmp_path) == first
    assert (first / "tokenizer.json").stat().st_mtime_ns == mtime


def test_tiny_tokenizer_build_is_deterministic(tmp_path, tokenizer_dir):
    again = build_tiny_tokenizer(tmp_path)
    assert (again / "tokenizer.json").read_bytes() == (tokenizer_dir / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("token", SPECIAL_TOKENS + ADDED_TOKENS)
def test_tiny_tokenizer_keeps_chat_tokens_whole(tokenizer, token):
    assert len(tokenizer.encode(token, add_special_tokens=False)) == 1


def test_tiny_tokenizer_round_trips_text(tokenizer):
    text = 'Let me check.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_tiny_template_lists_tools_in_the_system_prompt(chat):
    text = chat.decode(chat.prompt_ids([SYSTEM, USER]))
    assert "<tools>" in text and all(f'"name": "{s["function"]["name"]}"' in text for s in tool_schemas())


def test_loading_and_rendering_do_not_import_torch(tokenizer_dir):
    code = (
        "import sys; from agentcore.chat import ChatRenderer; from agentcore.toolparse import tool_schemas;"
        f"from agentcore.tiny_tokenizer import load_tokenizer; t = load_tokenizer({str(tokenizer_dir)!r});"
        "ChatRenderer(t, tool_schemas(), 'hermes'); assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# Incremental ids equal the full render.


def test_prompt_ids_equal_the_full_render(chat):
    assert chat.prompt_ids([SYSTEM, USER]) == render(chat, [SYSTEM, USER], generation_prompt=True)


def test_incremental_ids_equal_a_full_rerender(chat):
    hermes = get_parser("hermes")
    read = hermes.render_turn("Let me read it.", (ReadFile(path="model.py"),))
    write = WriteFile(path="kernels/a.cu", content="__global__ void k() {}")
    build = hermes.render_turn("", (write, Compile()))
    tool = [Message(role="tool", content="import torch\nclass Model: ...")]
    two_tools = [Message(role="tool", content="wrote 1 file"), Message(role="tool", content="compile ok")]
    nudge = [Message(role="user", content="Please call a tool.")]
    turns = [
        (read, "stop", tool),
        (build, "stop", two_tools),
        ("I need to think.", "stop", nudge),
        (hermes.render_turn("Done.", (Bash(command="ls kernels"),)), "stop", []),
    ]
    messages, ids = run_episode(chat, turns)
    assert ids == render(chat, messages, generation_prompt=False)


def test_ids_ending_in_an_observation_equal_the_render_with_generation_prompt(chat):
    messages, ids = run_episode(chat, [("<think>\nhm\n</think>\n\nOk.", "stop", [Message(role="tool", content="x")])])
    assert ids == render(chat, messages, generation_prompt=True)


def test_length_truncated_turn_is_closed_with_end_of_turn(chat):
    messages, ids = run_episode(chat, [("This turn was cut off mid-sen", "length", [Message(role="tool", content="x")])])
    assert ids == render(chat, messages, generation_prompt=True)


def test_close_turn_after_end_of_turn_adds_only_the_glue(chat):
    generated = sample(chat, "Hi.")
    assert chat.decode(chat.close_turn(generated, "stop")) == "\n"


def test_close_turn_without_end_of_turn_adds_it(chat):
    assert chat.decode(chat.close_turn(sample(chat, "Hi", stop=False), "length")) == "<|im_end|>\n"


def test_stop_tokens_are_the_end_of_turn_token(chat, tokenizer):
    assert chat.stop_token_ids == (tokenizer.convert_tokens_to_ids("<|im_end|>"),)


def test_assistant_text_drops_the_stop_token(chat):
    assert chat.assistant_text(sample(chat, "All done.")) == "All done."


def test_check_drift_accepts_incremental_ids(chat):
    messages, ids = run_episode(chat, [("Ok.", "stop", [Message(role="tool", content="x")])])
    chat.check_drift(messages, ids)


# ---------------------------------------------------------------------------------------------
# Drift.


def test_template_that_strips_past_reasoning_is_rejected(tokenizer_dir):
    with pytest.raises(TemplateDriftError, match="re-renders earlier turns"):
        ChatRenderer(with_template(tokenizer_dir, STRIP_PAST_THINK), tool_schemas(), "hermes")


def test_user_message_after_reasoning_drifts_with_a_qwen3_style_template(tokenizer_dir):
    chat = ChatRenderer(with_template(tokenizer_dir, STRIP_THINK_BEFORE_LAST_USER), [], "hermes")
    assert chat.observation_ids([Message(role="tool", content="ok")])  # tool results are safe
    with pytest.raises(TemplateDriftError):
        chat.observation_ids([Message(role="user", content="Go on.")])


def test_check_drift_catches_a_non_canonical_tokenization(chat, tokenizer):
    # A sampler may emit "kernel" letter by letter; re-rendering would merge it into one token.
    assert len(tokenizer.encode("kernel", add_special_tokens=False)) == 1
    generated = tokenizer.convert_tokens_to_ids(list("kernel")) + [chat.stop_token_ids[0]]
    observation = [Message(role="tool", content="x")]
    ids = chat.prompt_ids([SYSTEM, USER]) + generated + chat.close_turn(generated, "stop")
    ids += chat.observation_ids(observation)
    messages = [SYSTEM, USER, Message(role="assistant", content=chat.assistant_text(generated)), *observation]
    with pytest.raises(TemplateDriftError, match="differ from the template's render"):
        chat.check_drift(messages, ids)


def test_template_without_a_verbatim_assistant_turn_is_rejected(tokenizer_dir):
    template = STRIP_PAST_THINK.replace("not loop.last", "true")  # rewrites even the last turn
    with pytest.raises(TemplateDriftError, match="generation prompt"):
        ChatRenderer(with_template(tokenizer_dir, template), [], "hermes")
