"""Tool-call parsing: valid calls come back as ToolCall Structs, every malformed form as an error
string for the model (never an exception), and rendering round-trips for every tool."""

from __future__ import annotations

import msgspec
import pytest

from agentcore.toolparse import ParsedTurn, get_parser, make_call, tool_schemas
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
SAMPLE_CALLS = (
    Bash(command="nvcc --version && ls kernels/", timeout_s=30.5),
    ReadFile(path="model.py", offset=10, limit=50),
    WriteFile(path="kernels/relu.cu", content='#include <cuda_runtime.h>\n\n__global__ void k() {}\n'),
    EditFile(
        path="model_new.py",
        edits=(Edit(old_string="a", new_string="b", replace_all=True), Edit(old_string='"x"\n', new_string="")),
    ),
    Glob(pattern="kernels/*.cu"),
    Grep(pattern=r"__global__\s+void", path="kernels", glob="*.cu"),
    Compile(),
    Verify(),
    Profile(),
    Finish(summary="Fused the ReLU into the GEMM epilogue."),
)


def hermes(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def coder(name: str, params: dict[str, str]) -> str:
    inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{inner}</function>\n</tool_call>"


def only_error(turn: ParsedTurn) -> str:
    assert turn.calls == ()
    assert len(turn.errors) == 1
    return turn.errors[0]


# ---------------------------------------------------------------------------------------------
# Round trips and valid forms.


def test_samples_cover_every_tool():
    assert {c.__struct_config__.tag for c in SAMPLE_CALLS} == set(TOOL_NAMES)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("call", SAMPLE_CALLS, ids=lambda c: c.__struct_config__.tag)
def test_render_then_parse_round_trips(family, call):
    parser = get_parser(family)
    assert parser.parse(parser.render_call(call)) == ParsedTurn(content="", calls=(call,))


@pytest.mark.parametrize("family", FAMILIES)
def test_several_calls_in_one_turn_keep_their_order(family):
    parser = get_parser(family)
    turn = parser.parse(parser.render_turn("Let me look around.", SAMPLE_CALLS))
    assert turn == ParsedTurn(content="Let me look around.", calls=SAMPLE_CALLS)


@pytest.mark.parametrize("family", FAMILIES)
def test_text_without_calls_is_all_content(family):
    assert get_parser(family).parse("  I think the kernel is done.\n") == ParsedTurn(
        content="I think the kernel is done."
    )


def test_content_is_the_text_around_calls():
    text = "Before.\n" + hermes('{"name": "compile", "arguments": {}}') + "\nAfter."
    assert get_parser("hermes").parse(text).content == "Before.\n\nAfter."


def test_hermes_accepts_arguments_as_a_json_string():
    text = hermes('{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}')
    assert get_parser("hermes").parse(text).calls == (Bash(command="ls"),)


def test_hermes_missing_arguments_means_no_arguments():
    assert get_parser("hermes").parse(hermes('{"name": "verify"}')).calls == (Verify(),)


def test_hermes_close_tag_inside_a_json_string_is_data():
    call = WriteFile(path="notes.txt", content="a literal </tool_call> in a file")
    parser = get_parser("hermes")
    assert parser.parse(parser.render_call(call)).calls == (call,)


def test_coder_string_parameter_is_kept_verbatim():
    text = coder("bash", {"command": "123"})
    assert get_parser("qwen3_coder").parse(text).calls == (Bash(command="123"),)


def test_coder_non_string_parameters_are_json():
    edits = '[{"old_string": "x", "new_string": "y"}]'
    text = coder("edit_file", {"path": "a.cu", "edits": edits})
    expected = EditFile(path="a.cu", edits=(Edit(old_string="x", new_string="y"),))
    assert get_parser("qwen3_coder").parse(text).calls == (expected,)


def test_coder_value_may_contain_the_closing_parameter_tag():
    call = WriteFile(path="a.xml", content="<x>\n</parameter>\n</x>")
    parser = get_parser("qwen3_coder")
    assert parser.parse(parser.render_call(call)).calls == (call,)


def test_a_valid_call_survives_next_to_an_invalid_one():
    text = hermes('{"name": "nope", "arguments": {}}') + hermes('{"name": "profile", "arguments": {}}')
    turn = get_parser("hermes").parse(text)
    assert turn.calls == (Profile(),) and len(turn.errors) == 1


def test_make_call_builds_the_tagged_struct():
    assert make_call("glob", {"pattern": "*.py"}) == Glob(pattern="*.py")


# ---------------------------------------------------------------------------------------------
# Malformed calls: one error each, never an exception.

HERMES_MALFORMED = {
    "bad_json": (hermes('{"name": "bash", "arguments": {"command": }}'), "invalid JSON"),
    "unknown_tool": (hermes('{"name": "rm_rf", "arguments": {}}'), "unknown tool 'rm_rf'"),
    "missing_argument": (hermes('{"name": "bash", "arguments": {}}'), "missing required argument `command`"),
    "extra_argument": (hermes('{"name": "glob", "arguments": {"pattern": "*", "x": 1}}'), "unexpected argument `x`"),
    "mistyped_argument": (hermes('{"name": "read_file", "arguments": {"path": 7}}'), "Expected `str`, got `int`"),
    "out_of_range": (hermes('{"name": "read_file", "arguments": {"path": "a", "limit": 0}}'), "`limit`"),
    "arguments_not_object": (hermes('{"name": "bash", "arguments": ["ls"]}'), '"arguments" must be an object'),
    "arguments_bad_string": (hermes('{"name": "bash", "arguments": "{ls"}'), "not JSON"),
    "not_an_object": (hermes('["bash", "ls"]'), "expected a JSON object"),
    "missing_name": (hermes('{"arguments": {}}'), 'missing "name"'),
    "name_not_string": (hermes('{"name": 3, "arguments": {}}'), '"name" must be a string'),
    "extra_key": (hermes('{"name": "bash", "parameters": {"command": "ls"}}'), "unexpected keys ['parameters']"),
    "tool_key_smuggled": (hermes('{"name": "bash", "arguments": {"tool": "glob", "command": "ls"}}'), "`tool`"),
    "unclosed": ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}', "unclosed <tool_call>"),
    "stray_close": ("done </tool_call>", "without a matching <tool_call>"),
    "nested_edit_missing_field": (
        hermes('{"name": "edit_file", "arguments": {"path": "a", "edits": [{"old_string": "a"}]}}'),
        "missing required argument `new_string`",
    ),
}


@pytest.mark.parametrize("text, expected", HERMES_MALFORMED.values(), ids=HERMES_MALFORMED.keys())
def test_malformed_hermes_call_is_an_error_string(text, expected):
    assert expected in only_error(get_parser("hermes").parse(text))


CODER_MALFORMED = {
    "no_function_tag": ('<tool_call>\n{"name": "bash"}\n</tool_call>', "expected <function=NAME>"),
    "unknown_tool": (coder("rm_rf", {}), "unknown tool 'rm_rf'"),
    "missing_argument": (coder("write_file", {"path": "a"}), "missing required argument `content`"),
    "extra_argument": (coder("compile", {"force": "true"}), "unexpected argument `force`"),
    "number_not_json": (coder("bash", {"command": "ls", "timeout_s": "soon"}), "`timeout_s` must be JSON"),
    "edits_not_json": (coder("edit_file", {"path": "a", "edits": "[{old"}), "`edits` must be JSON"),
    "duplicate_parameter": (
        coder("glob", {"pattern": "a"}).replace("</function>", "<parameter=pattern>\nb\n</parameter>\n</function>"),
        "given twice",
    ),
    "unclosed_parameter": ("<tool_call>\n<function=bash>\n<parameter=command>\nls", "not closed by </parameter>"),
    "missing_end_function": (
        "<tool_call>\n<function=verify>\n</tool_call>",
        "expected <parameter=KEY> or </function>",
    ),
    "garbage_after_function": ("<tool_call>\n<function=verify>\n</function>\nhi</tool_call>", "expected </tool_call>"),
}


@pytest.mark.parametrize("text, expected", CODER_MALFORMED.values(), ids=CODER_MALFORMED.keys())
def test_malformed_coder_call_is_an_error_string(text, expected):
    assert expected in only_error(get_parser("qwen3_coder").parse(text))


def test_unknown_tool_error_lists_the_valid_tools():
    error = only_error(get_parser("hermes").parse(hermes('{"name": "run", "arguments": {}}')))
    assert all(name in error for name in TOOL_NAMES)


def test_argument_error_names_the_tool_and_its_usage():
    error = only_error(get_parser("hermes").parse(hermes('{"name": "bash", "arguments": {}}')))
    assert error.startswith("tool call #1 (bash):") and "Usage: bash(command: string" in error


def test_errors_are_numbered_by_call():
    text = hermes('{"name": "compile"}') + hermes('{"name": "x"}')
    assert get_parser("hermes").parse(text).errors[0].startswith("tool call #2:")


# ---------------------------------------------------------------------------------------------
# Registry and schemas.


def test_unknown_family_is_a_configuration_error():
    with pytest.raises(ValueError, match="unknown tool-call family"):
        get_parser("llama")


def test_qwen_aliases_use_the_hermes_format():
    assert get_parser("qwen2.5") is get_parser("hermes") is get_parser("qwen3")


def test_parsed_turn_is_frozen():
    with pytest.raises(AttributeError):
        ParsedTurn(content="").content = "x"  # type: ignore[misc]


def test_tool_schemas_describe_every_tool():
    schemas = tool_schemas()
    assert [s["function"]["name"] for s in schemas] == list(TOOL_NAMES)
    assert all(s["type"] == "function" and s["function"]["description"] for s in schemas)


def test_tool_schemas_hide_the_tag_and_inline_references():
    text = msgspec.json.encode(tool_schemas()).decode()
    assert '"tool"' not in text and "$ref" not in text


def test_tool_schema_marks_required_arguments():
    bash = next(s for s in tool_schemas() if s["function"]["name"] == "bash")["function"]
    assert bash["parameters"]["required"] == ["command"]
    assert bash["parameters"]["properties"]["timeout_s"]["default"] == 120.0
