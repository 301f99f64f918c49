"""Tool calls in model text: parse them into `ToolCall`s and render them back, per model family.

What it is: one parser per tool-call format, chosen through a registry with `get_parser(family)`:
`hermes` (Qwen2.5, Qwen3, Hermes: a JSON object inside `<tool_call>` tags) and `qwen3_coder`
(Qwen3-Coder: `<function=NAME>` with one `<parameter=KEY>` block per argument). Each parser also
renders a call as the exact text it reads back, for demonstrations and tests, and
`tool_schemas()` gives the OpenAI-style function schemas that chat templates list in the prompt.

What it is not: it runs no tool and knows no chat template; `agentcore.chat` renders messages.

How it is used: the rollout parses every assistant turn. A malformed call is the model's failure,
so `parse` never raises: each problem becomes a readable line in `ParsedTurn.errors` (naming the
tool, the problem and the valid choices) that goes back to the model as a tool error.

Example:
    parser = get_parser("hermes")
    turn = parser.parse(text)          # ParsedTurn(content=..., calls=(Bash(...),), errors=())
    text = parser.render_call(Bash(command="nvcc --version"))
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
import orjson
from msgspec import Struct
from msgspec import inspect as mi

from agentcore.types import TOOL_CALL_TYPES, TOOL_NAMES, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class ParsedTurn(Struct, frozen=True, kw_only=True):
    """An assistant turn split into prose, valid calls and one message per invalid call."""

    content: str
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()


class ToolParser(Protocol):
    family: str

    def parse(self, text: str) -> ParsedTurn: ...

    def render_call(self, call: ToolCall) -> str: ...

    def render_turn(self, content: str, calls: tuple[ToolCall, ...]) -> str: ...


# ---------------------------------------------------------------------------------------------
# Facts about each tool, computed once from the Structs in agentcore.types.

_TOOLS: dict[str, type] = dict(zip(TOOL_NAMES, TOOL_CALL_TYPES))
_FIELDS: dict[str, tuple[mi.Field, ...]] = {n: mi.type_info(t).fields for n, t in _TOOLS.items()}
_VALID_TOOLS = ", ".join(TOOL_NAMES)


_TYPE_NAMES = {
    mi.StrType: "string",
    mi.IntType: "integer",
    mi.FloatType: "number",
    mi.BoolType: "boolean",
    mi.NoneType: "null",
}


def _type_name(t: mi.Type) -> str:
    if isinstance(t, mi.UnionType):
        return " | ".join(_type_name(u) for u in t.types)
    if isinstance(t, (mi.VarTupleType, mi.ListType)):
        return f"array of {_type_name(t.item_type)}"
    if isinstance(t, mi.StructType):
        return "{" + ", ".join(f.name + ("" if f.required else "?") for f in t.fields) + "}"
    return _TYPE_NAMES.get(type(t), "value")


def _accepts_str(t: mi.Type) -> bool:
    if isinstance(t, mi.UnionType):
        return any(isinstance(u, mi.StrType) for u in t.types)
    return isinstance(t, mi.StrType)


def _signature(name: str) -> str:
    parts = []
    for f in _FIELDS[name]:
        default = "" if f.required else f" = {json.dumps(f.default)}"
        parts.append(f"{f.name}: {_type_name(f.type)}{default}")
    return f"{name}({', '.join(parts)})"


_SIGNATURES = {n: _signature(n) for n in TOOL_NAMES}
_STRING_ARGS = {n: frozenset(f.name for f in fs if _accepts_str(f.type)) for n, fs in _FIELDS.items()}
_FIELD_NAMES = {n: frozenset(f.name for f in fs) for n, fs in _FIELDS.items()}


def _arguments(call: ToolCall) -> dict[str, Any]:
    """The call's arguments as JSON builtins, fields left at their default omitted."""
    name = call.__struct_config__.tag
    out = {}
    for f in _FIELDS[name]:
        value = getattr(call, f.name)
        if f.required or value != f.default:
            out[f.name] = msgspec.to_builtins(value)
    return out


def tool_schemas() -> list[dict[str, Any]]:
    """OpenAI function schemas (`{"type": "function", "function": {...}}`) for every tool."""
    return [_schema(name, cls) for name, cls in _TOOLS.items()]


def _schema(name: str, cls: type) -> dict[str, Any]:
    doc = msgspec.json.schema(cls)
    body = _inline(doc["$defs"][cls.__name__], doc["$defs"])
    props = {k: v for k, v in body.get("properties", {}).items() if k != "tool"}
    required = [k for k in body.get("required", []) if k != "tool"]
    params = {"type": "object", "properties": props, "required": required}
    function = {"name": name, "description": (cls.__doc__ or "").strip(), "parameters": params}
    return {"type": "function", "function": function}


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """Replace `$ref`s by the definitions they point to (templates show schemas verbatim)."""
    if isinstance(node, list):
        return [_inline(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _inline(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    return {k: _inline(v, defs) for k, v in node.items() if k != "title"}


# ---------------------------------------------------------------------------------------------
# From (name, arguments) to a ToolCall or an error line.


_JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    type(None): "null",
}


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _humanize(message: str) -> str:
    """Reword msgspec's validation message in terms of tool arguments."""
    message = message.replace("Object missing required field", "missing required argument")
    message = message.replace("Object contains unknown field", "unexpected argument")
    return message.replace(" - at `$.", " - at argument `")


def _error(index: int, name: str | None, problem: str) -> str:
    where = f"tool call #{index}" + (f" ({name})" if name else "")
    return f"{where}: {problem}"


def make_call(name: Any, arguments: Any, index: int = 1) -> ToolCall | str:
    """Validate one call; return the ToolCall or a message for the model."""
    if not isinstance(name, str):
        return _error(index, None, f'"name" must be a string naming the tool, got {_json_type(name)}')
    if name not in _TOOLS:
        return _error(index, None, f"unknown tool {name!r}. Valid tools: {_VALID_TOOLS}")
    usage = f". Usage: {_SIGNATURES[name]}"
    if not isinstance(arguments, dict):
        return _error(index, name, f'"arguments" must be an object, got {_json_type(arguments)}{usage}')
    if "tool" in arguments:
        return _error(index, name, f"unexpected argument `tool`{usage}")
    try:
        # Same validation as converting to the ToolCall union, which msgspec re-resolves on
        # every call (16 us instead of 1 us).
        return msgspec.convert({"tool": name, **arguments}, _TOOLS[name])
    except msgspec.ValidationError as e:
        return _error(index, name, _humanize(str(e)) + usage)


def _unclosed(index: int, name: str | None) -> str:
    return _error(index, name, f"unclosed {OPEN}: the text ended before {CLOSE}")


_WS = re.compile(r"\s*")
_Reader = Callable[[str, int, int], tuple[int, "ToolCall | str"]]


def _scan(text: str, read_call: _Reader) -> ParsedTurn:
    """Split `text` at `<tool_call>` blocks; `read_call` reads one block from after its OPEN tag
    and returns (end of the block, call or error)."""
    content, calls, errors = [], [], []
    pos = blocks = 0
    while True:
        start = text.find(OPEN, pos)
        piece = text[pos:] if start < 0 else text[pos:start]
        if CLOSE in piece:
            errors.append(f"found {CLOSE} without a matching {OPEN} before it")
        content.append(piece)
        if start < 0:
            break
        blocks += 1
        pos, result = read_call(text, start + len(OPEN), blocks)
        (errors if isinstance(result, str) else calls).append(result)
    return ParsedTurn(content="".join(content).strip(), calls=tuple(calls), errors=tuple(errors))


def _resync(text: str, pos: int) -> int:
    """Where scanning resumes after a bad block: after the next CLOSE, else the end."""
    close = text.find(CLOSE, pos)
    return len(text) if close < 0 else close + len(CLOSE)


# ---------------------------------------------------------------------------------------------
# hermes: <tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>

_JSON = json.JSONDecoder()
_HERMES_SHAPE = 'write {"name": <tool name>, "arguments": {<argument>: <value>, ...}}'


class HermesParser:
    family = "hermes"

    def parse(self, text: str) -> ParsedTurn:
        return _scan(text, _read_hermes)

    def render_call(self, call: ToolCall) -> str:
        body = {"name": call.__struct_config__.tag, "arguments": _arguments(call)}
        return f"{OPEN}\n{json.dumps(body, ensure_ascii=False)}\n{CLOSE}"

    def render_turn(self, content: str, calls: tuple[ToolCall, ...]) -> str:
        return "\n".join(([content] if content else []) + [self.render_call(c) for c in calls])


def _read_hermes(text: str, start: int, index: int) -> tuple[int, ToolCall | str]:
    close = text.find(CLOSE, start)
    if close < 0:
        return len(text), _unclosed(index, None)
    try:
        return close + len(CLOSE), _hermes_call(orjson.loads(text[start:close]), index)
    except orjson.JSONDecodeError as e:
        problem = str(e)
    # The JSON may hold a literal CLOSE inside a string: decode past it, then expect CLOSE.
    try:
        obj, end = _JSON.raw_decode(text, _WS.match(text, start).end())
    except (ValueError, RecursionError):
        obj, end = None, -1
    after = _WS.match(text, end).end() if end >= 0 else -1
    if end >= 0 and text.startswith(CLOSE, after):
        return after + len(CLOSE), _hermes_call(obj, index)
    return close + len(CLOSE), _error(index, None, f"invalid JSON ({problem}); {_HERMES_SHAPE}")


def _hermes_call(obj: Any, index: int) -> ToolCall | str:
    if not isinstance(obj, dict):
        return _error(index, None, f"expected a JSON object, got {_json_type(obj)}; {_HERMES_SHAPE}")
    extra = sorted(set(obj) - {"name", "arguments"})
    if extra or "name" not in obj:
        name = obj.get("name") if isinstance(obj.get("name"), str) else None
        problem = f"unexpected keys {extra}" if extra else 'missing "name"'
        return _error(index, name, f"{problem}; {_HERMES_SHAPE}")
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # some models send the arguments as a JSON string
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError as e:
            return _error(index, str(obj["name"]), f'"arguments" is a string but not JSON ({e})')
    return make_call(obj["name"], arguments, index)


# ---------------------------------------------------------------------------------------------
# qwen3_coder: <tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>

_FUNC, _PARAM, _END_PARAM, _END_FUNC = "<function=", "<parameter=", "</parameter>", "</function>"


class Qwen3CoderParser:
    family = "qwen3_coder"

    def parse(self, text: str) -> ParsedTurn:
        return _scan(text, _read_coder)

    def render_call(self, call: ToolCall) -> str:
        name = call.__struct_config__.tag
        params = []
        for key, value in _arguments(call).items():
            raw = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            params.append(f"{_PARAM}{key}>\n{raw}\n{_END_PARAM}\n")
        return f"{OPEN}\n{_FUNC}{name}>\n{''.join(params)}{_END_FUNC}\n{CLOSE}"

    def render_turn(self, content: str, calls: tuple[ToolCall, ...]) -> str:
        return "\n".join(([content] if content else []) + [self.render_call(c) for c in calls])


def _read_coder(text: str, start: int, index: int) -> tuple[int, ToolCall | str]:
    pos = _WS.match(text, start).end()
    gt = text.find(">", pos)
    if not text.startswith(_FUNC, pos) or gt < 0:
        return _resync(text, pos), _error(index, None, f"expected {_FUNC}NAME> right after {OPEN}")
    name, pos, raw = text[pos + len(_FUNC) : gt].strip(), gt + 1, {}
    while True:
        pos = _WS.match(text, pos).end()
        if text.startswith(_PARAM, pos):
            pos, problem = _read_param(text, pos, raw)
            if problem:
                return _resync(text, pos), _error(index, name, problem)
        elif text.startswith(_END_FUNC, pos):
            after = _WS.match(text, pos + len(_END_FUNC)).end()
            if not text.startswith(CLOSE, after):
                return _resync(text, after), _error(index, name, f"expected {CLOSE} after {_END_FUNC}")
            return after + len(CLOSE), _coder_call(name, raw, index)
        elif pos >= len(text) or text.find(CLOSE, pos) < 0:
            return len(text), _unclosed(index, name)
        else:
            problem = f"expected {_PARAM}KEY> or {_END_FUNC}, got {text[pos : pos + 20]!r}"
            return _resync(text, pos), _error(index, name, problem)


def _read_param(text: str, pos: int, raw: dict[str, str]) -> tuple[int, str | None]:
    gt = text.find(">", pos)
    if gt < 0:
        return len(text), f"unclosed {_PARAM}"
    key, start = text[pos + len(_PARAM) : gt].strip(), gt + 1
    end = _param_end(text, start)
    if end < 0:
        return len(text), f"parameter `{key}` is not closed by {_END_PARAM}"
    if key in raw:
        return end, f"parameter `{key}` given twice"
    raw[key] = text[start:end].removeprefix("\n").removesuffix("\n")  # the template's newlines
    return end + len(_END_PARAM), None


def _param_end(text: str, start: int) -> int:
    """The `</parameter>` that ends this value: the first one followed by another parameter or
    `</function>`, so a value may itself contain the closing tag; else the first one."""
    first = end = text.find(_END_PARAM, start)
    while end >= 0:
        after = _WS.match(text, end + len(_END_PARAM)).end()
        if text.startswith(_PARAM, after) or text.startswith(_END_FUNC, after):
            return end
        end = text.find(_END_PARAM, end + 1)
    return first


def _coder_call(name: str, raw: dict[str, str], index: int) -> ToolCall | str:
    if name not in _TOOLS:
        return make_call(name, raw, index)
    arguments = {}
    for key, value in raw.items():
        if key in _STRING_ARGS[name] or key not in _FIELD_NAMES[name]:
            arguments[key] = value
            continue
        try:
            arguments[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            problem = f"argument `{key}` must be JSON, got {value[:40]!r}. Usage: {_SIGNATURES[name]}"
            return _error(index, name, problem)
    return make_call(name, arguments, index)


# ---------------------------------------------------------------------------------------------
# Registry.

_PARSERS: dict[str, ToolParser] = {}


def register_parser(parser: ToolParser, *aliases: str) -> None:
    for family in (parser.family, *aliases):
        _PARSERS[family] = parser


def get_parser(family: str) -> ToolParser:
    """The parser for a model family; an unknown family is a configuration bug and raises."""
    try:
        return _PARSERS[family]
    except KeyError:
        raise ValueError(f"unknown tool-call family {family!r}; known: {sorted(_PARSERS)}") from None


register_parser(HermesParser(), "qwen2.5", "qwen3")
register_parser(Qwen3CoderParser())
