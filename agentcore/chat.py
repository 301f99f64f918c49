"""Token ids for a multi-turn chat, built turn by turn with the model's own chat template.

What it is: `ChatRenderer` turns messages into the exact token ids a policy sees. The first
prompt is rendered once; afterwards the sampled ids are kept as they are, closed with the
template's end-of-turn glue, and followed by the ids of the new tool/user messages only. Those are
cut from a render of a fixed small BASE conversation plus the new messages, minus the cached
render of BASE, so no turn ever re-renders the whole chat: re-rendering changes earlier tokens
(templates strip `<think>`, re-tokenization differs from sampling) and breaks PPO's token
bookkeeping (the sampled ids and their log-probs must be the ones trained on).

What it is not: it does not parse tool calls (`agentcore.toolparse`) nor talk to the model.

How it is used: the rollout keeps `prompt_ids(messages)`, then per turn appends the generated
ids, `close_turn(...)` and `observation_ids(new_messages)`. `check_drift` re-renders a whole
conversation once, for tests and debugging. A template that cannot be cut this way raises
`TemplateDriftError` (at construction for the assistant and tool probes, per call otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agentcore.toolparse import ToolParser, get_parser
from agentcore.types import FinishReason, Message

# The fixed conversation every observation is cut from. The assistant message carries a <think>
# block so that templates which strip reasoning from earlier turns are caught.
BASE: tuple[Message, ...] = (
    Message(role="system", content="You are a helpful assistant."),
    Message(role="user", content="Base question."),
    Message(role="assistant", content="<think>\nBase reasoning.\n</think>\n\nBase answer."),
)
_PROBES = ([Message(role="tool", content="Probe result.")], [Message(role="user", content="Probe.")])
# Observations are cut from renders with this one-tool list where that changes nothing (checked
# per template): the tool list is most of a render's cost and shows only in the system prompt.
_STUB_TOOLS = [{"type": "function", "function": {"name": "stub", "description": "Stub.",
                "parameters": {"type": "object", "properties": {}, "required": []}}}]


_PROMPT_CACHE = 1024  # prompts kept (first in, first out)


class TemplateDriftError(RuntimeError):
    """The chat template renders earlier turns differently once later turns are added."""


class ChatRenderer:
    """Incremental token ids for one tokenizer, tool list and tool-call family.

    Example:
        chat = ChatRenderer(tokenizer, tool_schemas(), "hermes")
        ids = chat.prompt_ids([Message(role="system", ...), Message(role="user", ...)])
        gen = await engine.generate(ids, SamplingParams(..., stop_token_ids=chat.stop_token_ids))
        ids += gen.token_ids + chat.close_turn(gen.token_ids, gen.finish_reason)
        ids += chat.observation_ids([Message(role="tool", content=result_text)])
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: list[dict[str, Any]],
        family: str,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.parser: ToolParser = get_parser(family)
        self._template_kwargs = dict(template_kwargs or {})
        self._encode = _fast_encoder(tokenizer)
        self._glue_ids = self._assistant_glue()
        self._obs_tools = self._observation_tools()
        self._base_text = self._render(BASE, generation_prompt=False, tools=self._obs_tools)
        self._base_ids = self._encode(self._base_text)
        self._eot_id = self._glue_ids[0] if self._glue_ids and self._is_added(self._glue_ids[0]) else None
        self.stop_token_ids: tuple[int, ...] = _unique(self._eot_id, tokenizer.eos_token_id)
        self._boundaries = tuple(
            t.content for t in tokenizer.added_tokens_decoder.values() if not t.lstrip
        )
        self._prompts: dict[tuple[Message, ...], list[int]] = {}
        self._shapes: dict[tuple[tuple[str, str | None], ...], tuple[str, ...]] = {}
        self._check_observation_probe()

    # -- per-turn API ---------------------------------------------------------------------

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The first prompt: the whole conversation so far plus the generation prompt.

        Cached by the messages: the n samples of a task share their prompt, and a long prompt
        (tool schemas, the task's source) costs milliseconds to render and tokenize."""
        key = tuple(messages)
        ids = self._prompts.get(key)
        if ids is None:
            ids = self._encode(self._render(messages, generation_prompt=True, tools=self.tools))
            if len(self._prompts) >= _PROMPT_CACHE:
                self._prompts.pop(next(iter(self._prompts)))
            self._prompts[key] = ids
        return list(ids)

    def close_turn(self, generated_ids: Sequence[int], finish_reason: FinishReason) -> list[int]:
        """Template glue after the sampled ids, so the stored turn equals the template's.

        The decision rests on the last token, not on `finish_reason`: a turn that ended with the
        end-of-turn token gets the rest of the glue (Qwen: "\\n"); a turn cut by length, aborted,
        or whose stop token the server trimmed gets the end-of-turn token too.
        """
        del finish_reason  # the last token says all that matters (see above)
        if generated_ids and self._eot_id is not None and generated_ids[-1] == self._eot_id:
            return self._glue_ids[1:]
        return list(self._glue_ids)

    def observation_ids(self, messages: Sequence[Message]) -> list[int]:
        """Ids of new tool/user messages plus the generation prompt, cut from BASE + messages."""
        if self._boundaries:
            delta = self._substituted_delta(messages)
            if delta is not None:  # an added token splits tokenization at its start
                return self._encode(delta)
        full = self._render((*BASE, *messages), generation_prompt=True, tools=self._obs_tools)
        if not full.startswith(self._base_text):
            raise TemplateDriftError(_drift_text(self._base_text, full, messages))
        delta = full[len(self._base_text) :]
        if delta.startswith(self._boundaries):
            return self._encode(delta)
        return self._cut_ids(full, messages)

    def _substituted_delta(self, messages: Sequence[Message]) -> str | None:
        """The observation text without running the template: the literal pieces around each
        message's content, learned once per shape (roles and names) from a render with marker
        contents and checked against a second render with awkward contents. None where the
        template transforms contents (strips, escapes) or the shape renders otherwise."""
        shape = tuple((m.role, m.name) for m in messages)
        pieces = self._shapes.get(shape)
        if pieces is None:
            pieces = self._shapes[shape] = self._learn_shape(messages) if len(self._shapes) < 512 else ()
        if not pieces:
            return None
        out = [pieces[0]]
        for message, piece in zip(messages, pieces[1:]):
            out += (message.content, piece)
        delta = "".join(out)
        return delta if delta.startswith(self._boundaries) else None

    def _learn_shape(self, messages: Sequence[Message]) -> tuple[str, ...]:
        markers = [f"\x00MARK{i}\x00" for i in range(len(messages))]
        delta = self._delta(_with_contents(messages, markers), self._obs_tools)
        if delta is None or any(delta.count(m) != 1 for m in markers):
            return ()
        pieces, rest = [], delta
        for marker in markers:
            head, rest = rest.split(marker)
            pieces.append(head)
        pieces.append(rest)
        awkward = [f"  \n{{x}} <y> {i}\n\n  " for i in range(len(messages))]
        check = self._delta(_with_contents(messages, awkward), self._obs_tools)
        joined = pieces[0] + "".join(c + p for c, p in zip(awkward, pieces[1:]))
        return tuple(pieces) if check == joined else ()

    def assistant_text(self, generated_ids: Sequence[int]) -> str:
        """The turn's text for the parser and the assistant message: a trailing stop token dropped."""
        ids = list(generated_ids)
        if ids and ids[-1] in self.stop_token_ids:
            ids.pop()
        return self.decode(ids)

    def decode(self, ids: Sequence[int]) -> str:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:  # the Python wrapper walks every id first: 2x slower
            return backend.decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def check_drift(self, messages: Sequence[Message], ids: Sequence[int]) -> None:
        """Re-render the whole conversation once and raise if `ids` differ from it."""
        open_turn = bool(messages) and messages[-1].role != "assistant"
        expected = self._encode(self._render(messages, generation_prompt=open_turn, tools=self.tools))
        if list(ids) != expected:
            raise TemplateDriftError(self._mismatch(list(ids), expected))

    # -- construction-time probes ---------------------------------------------------------

    def _assistant_glue(self) -> list[int]:
        """Ids the template puts after an assistant message's content (Qwen: <|im_end|> "\\n")."""
        head = self._render(BASE[:2], generation_prompt=True, tools=self.tools)
        full = self._render(BASE, generation_prompt=False, tools=self.tools)
        content = BASE[2].content
        if not full.startswith(head + content):
            raise TemplateDriftError(
                "the template does not render an assistant message as its generation prompt "
                f"followed by the content verbatim; after the prompt it wrote {full[len(head):][:200]!r}"
            )
        glue = full[len(head) + len(content) :]
        glue_ids = self._encode(glue)
        if self._encode(full) != self._encode(head + content) + glue_ids:
            raise TemplateDriftError(f"the end-of-turn text {glue!r} merges with the content's tokens")
        return glue_ids

    def _observation_tools(self) -> list[dict[str, Any]] | None:
        if not self.tools:
            return None
        same = all(self._delta(p, self.tools) == self._delta(p, _STUB_TOOLS) for p in _PROBES)
        return _STUB_TOOLS if same else self.tools

    def _delta(self, messages: Sequence[Message], tools: Any) -> str | None:
        base = self._render(BASE, generation_prompt=False, tools=tools)
        full = self._render((*BASE, *messages), generation_prompt=True, tools=tools)
        return full[len(base) :] if full.startswith(base) else None

    def _check_observation_probe(self) -> None:
        """Fail now if BASE's ids are not a prefix of BASE + a tool message; use the fast cut
        only where it is exact. (A user message may still drift, e.g. Qwen3 drops earlier
        reasoning after a new user query; `observation_ids` raises then.)"""
        probe = _PROBES[0]
        full = self._render((*BASE, *probe), generation_prompt=True, tools=self._obs_tools)
        if self.observation_ids(probe) != self._cut_ids(full, probe):
            self._boundaries = ()  # tokenization does not split at the boundary

    # -- helpers --------------------------------------------------------------------------

    def _render(self, messages: Sequence[Message], *, generation_prompt: bool, tools: Any) -> str:
        return self.tokenizer.apply_chat_template(
            [m.as_dict() for m in messages],
            tools=tools,
            add_generation_prompt=generation_prompt,
            tokenize=False,
            **self._template_kwargs,
        )

    def _cut_ids(self, full: str, messages: Sequence[Message]) -> list[int]:
        ids = self._encode(full)
        n = len(self._base_ids)
        if ids[:n] != self._base_ids:
            raise TemplateDriftError(
                "the tokens of the BASE conversation are not a prefix of BASE + new messages "
                f"({[m.role for m in messages]}): " + self._mismatch(ids[:n], self._base_ids)
            )
        return ids[n:]

    def _is_added(self, token_id: int) -> bool:
        return token_id in self.tokenizer.added_tokens_decoder

    def _mismatch(self, got: list[int], expected: list[int]) -> str:
        i = next((k for k, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        return (
            f"stored ids differ from the template's render at token {i} "
            f"(lengths {len(got)} vs {len(expected)}): stored {self.decode(got[i : i + 12])!r}, "
            f"template {self.decode(expected[i : i + 12])!r}"
        )


def _fast_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """One call into the Rust tokenizer when there is one; the Python wrapper costs 2x more."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda text: backend.encode(text, add_special_tokens=False).ids
    return lambda text: tokenizer.encode(text, add_special_tokens=False)


def _with_contents(messages: Sequence[Message], contents: Sequence[str]) -> list[Message]:
    return [Message(role=m.role, name=m.name, content=c) for m, c in zip(messages, contents)]


def _unique(*ids: int | None) -> tuple[int, ...]:
    return tuple(dict.fromkeys(i for i in ids if i is not None))


def _drift_text(base: str, full: str, messages: Sequence[Message]) -> str:
    i = next((k for k, (a, b) in enumerate(zip(base, full)) if a != b), len(full))
    return (
        f"the template re-renders earlier turns once {[m.role for m in messages]} messages follow: "
        f"at character {i} BASE reads {base[i : i + 80]!r} but BASE + new reads {full[i : i + 80]!r}"
    )
