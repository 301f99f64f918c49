"""Property tests for the tool-call parsers: any text parses without raising, valid calls
round-trip through rendering, and a truncated rendering never yields a call that was not there."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcore.toolparse import ParsedTurn, get_parser
from agentcore.types import (
    TOOL_NAMES,
    Bash,
    Compile,
    Edit,
    EditFile,
    Finish,
    Glob,
    Grep,
    Profile,
    ReadFile,
    Verify,
    WriteFile,
)

FAMILIES = ("hermes", "qwen3_coder")
# About 1,200 examples and 3,000 parsed texts in all, a few seconds (hypothesis spends most of
# it generating); raise max_examples locally to dig deeper.
FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TAGS = (
    *("<tool_call>", "</tool_call>", "<function=bash>", "<function=", "</function>"),
    *("<parameter=command>", "<parameter=", "</parameter>"),
    *('{"name": "bash"', '"arguments": {', '"command": "ls"', "}", "{", "]", "[", '"', "\n", ">"),
)

fragments = st.lists(st.sampled_from(TAGS) | st.text(max_size=6), max_size=20).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=6,
)

text = st.text(max_size=60) | st.sampled_from(["", "\n", " x ", "</tool_call>", "<tool_call>", "</parameter>"])
int64 = st.integers(min_value=0, max_value=2**63 - 1)  # orjson reads larger integers as floats
timeouts = st.floats(min_value=0, max_value=600, exclude_min=True, allow_nan=False)
edits = st.builds(Edit, old_string=text, new_string=text, replace_all=st.booleans())
calls = st.one_of(
    st.builds(Bash, command=text, timeout_s=timeouts),
    st.builds(ReadFile, path=text, offset=int64, limit=int64.filter(bool)),
    st.builds(WriteFile, path=text, content=text),
    st.builds(EditFile, path=text, edits=st.lists(edits, min_size=1, max_size=3).map(tuple)),
    st.builds(Glob, pattern=text),
    st.builds(Grep, pattern=text, path=text, glob=st.none() | text),
    st.just(Compile()),
    st.just(Verify()),
    st.just(Profile()),
    st.builds(Finish, summary=text),
)
prose = st.text(max_size=40).filter(lambda s: "<tool_call>" not in s and "</tool_call>" not in s)


def well_formed(turn: object) -> bool:
    return (
        isinstance(turn, ParsedTurn)
        and isinstance(turn.content, str)
        and all(isinstance(e, str) and e for e in turn.errors)
    )


def coder_safe(call: object) -> bool:
    """A qwen3_coder string value cannot end a parameter early: the format has no escaping."""
    return b"</parameter>" not in msgspec.json.encode(call)


@pytest.mark.parametrize("family", FAMILIES)
@settings(FAST, max_examples=150)
@given(st.lists(st.text(), min_size=1, max_size=8))
def test_any_text_parses_without_raising(family, texts):
    assert all(well_formed(get_parser(family).parse(s)) for s in texts)


@pytest.mark.parametrize("family", FAMILIES)
@FAST
@given(st.lists(fragments, min_size=1, max_size=3))
def test_tag_soup_parses_without_raising(family, texts):
    assert all(well_formed(get_parser(family).parse(s)) for s in texts)


@FAST
@given(json_values | st.text())
def test_any_json_inside_hermes_tags_parses_without_raising(value):
    body = value if isinstance(value, str) else json.dumps(value)
    assert well_formed(get_parser("hermes").parse(f"<tool_call>\n{body}\n</tool_call>"))


@FAST
@given(st.sampled_from(TOOL_NAMES), st.dictionaries(st.text(max_size=10), json_values, max_size=4))
def test_arbitrary_arguments_give_a_call_or_an_error(name, arguments):
    body = json.dumps({"name": name, "arguments": arguments})
    turn = get_parser("hermes").parse(f"<tool_call>\n{body}\n</tool_call>")
    assert len(turn.calls) + len(turn.errors) == 1


coder_keys = st.sampled_from(["command", "path", "edits", "timeout_s", "offset", "x"])
coder_values = st.text(max_size=12) | json_values.map(json.dumps)


@FAST
@given(st.sampled_from(TOOL_NAMES), st.dictionaries(coder_keys, coder_values, max_size=4))
def test_arbitrary_coder_parameters_give_a_call_or_an_error(name, params):
    inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    turn = get_parser("qwen3_coder").parse(f"<tool_call>\n<function={name}>\n{inner}</function>\n</tool_call>")
    assert len(turn.calls) + len(turn.errors) == 1


@pytest.mark.parametrize("family", FAMILIES)
@settings(FAST, max_examples=120)
@given(prose, st.lists(calls, max_size=4).map(tuple))
def test_valid_calls_round_trip(family, content, turn_calls):
    if family == "qwen3_coder":
        turn_calls = tuple(c for c in turn_calls if coder_safe(c))
    parser = get_parser(family)
    turn = parser.parse(parser.render_turn(content.strip(), turn_calls))
    assert turn == ParsedTurn(content=content.strip(), calls=turn_calls)


@pytest.mark.parametrize("family", FAMILIES)
@FAST
@given(st.lists(calls, min_size=1, max_size=3).map(tuple), st.lists(st.floats(0, 1), min_size=1, max_size=8))
def test_truncated_rendering_never_invents_a_call(family, turn_calls, fractions):
    if family == "qwen3_coder":
        turn_calls = tuple(c for c in turn_calls if coder_safe(c))
    parser = get_parser(family)
    rendered = parser.render_turn("", turn_calls)
    for fraction in fractions:
        turn = parser.parse(rendered[: int(len(rendered) * fraction)])
        assert well_formed(turn)
        assert turn.calls == turn_calls[: len(turn.calls)]
