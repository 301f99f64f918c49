"""SGLang's native JSON contract as we speak it: the /generate payload and how answers are read.

What it is: pure functions and wire Structs, no I/O. Field names follow SGLang's
`managers/io_struct.py` (GenerateReqInput, SamplingParams, AbortReq, the weight-update inputs)
and `entrypoints/http_server.py` (status codes, `{success, message}` acks), both under SGLang's
`python/sglang/srt/`. What it is not: the retry or resume policy (`client.py`).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
import msgspec
from msgspec import Struct

from agentcore.engine import EngineError, Generation, SamplingParams


class _FinishReason(Struct, frozen=True):
    type: str
    message: str | None = None


class _MetaInfo(Struct, frozen=True):
    finish_reason: _FinishReason | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    weight_version: str | int | None = None
    output_token_logprobs: list[tuple[float | None, int, Any]] | None = None  # [[lp, id, text]]


class _GenerateOut(Struct, frozen=True):
    meta_info: _MetaInfo
    output_ids: list[int] | None = None


class Ack(Struct, frozen=True, kw_only=True):
    """The `{success, message}` answer of weight-update (and newer memory) endpoints."""

    success: bool = True
    message: str = ""
    num_paused_requests: int | None = 0


_generate_decoder = msgspec.json.Decoder(_GenerateOut)
_ack_decoder = msgspec.json.Decoder(Ack | None)
encoder = msgspec.json.Encoder()


def parse_weight_version(value: str | int | None) -> int:
    """SGLang's weight_version is a free string ("default" until set): digits -> int, else 0."""
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return 0


def rid_prefix(session_id: str) -> str:
    """SGLang aborts by rid prefix; this prefix selects exactly one session's requests."""
    return f"{session_id}/"


def generate_payload(
    input_ids: list[int], params: SamplingParams, budget: int, session_id: str
) -> dict[str, Any]:
    """A token-in/token-out /generate request with a fresh rid (SGLang refuses duplicates)."""
    sampling: dict[str, Any] = {
        "max_new_tokens": budget,  # SGLang's default is only 128: always set it
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "stop_token_ids": list(params.stop_token_ids),
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    # A server started with --enable-deterministic-inference samples every unseeded request with
    # seed 42 (a group's samples of one prompt would all be the same): never send none.
    sampling["sampling_seed"] = params.seed if params.seed is not None else random.getrandbits(31)
    return {
        "input_ids": input_ids,
        "sampling_params": sampling,
        "rid": rid_prefix(session_id) + uuid.uuid4().hex,
        "return_logprob": True,
        "logprob_start_len": -1,
    }


def parse_generation(content: bytes, budget: int, url: str) -> Generation:
    """Read one /generate answer, checking it against the request; raise on any violation."""

    def violation(what: str) -> EngineError:
        return EngineError(f"SGLang at {url} broke the protocol: {what}")

    try:
        out = _generate_decoder.decode(content)
    except msgspec.DecodeError as exc:
        raise violation(f"undecodable response ({exc})") from exc
    meta = out.meta_info
    if meta.finish_reason is None or meta.finish_reason.type not in ("stop", "length", "abort"):
        raise violation(f"finish_reason {meta.finish_reason!r}")
    ids = out.output_ids or []
    entries = meta.output_token_logprobs or []
    if len(entries) != len(ids):
        raise violation(f"{len(entries)} output_token_logprobs for {len(ids)} output_ids")
    if len(ids) > budget:
        raise violation(f"{len(ids)} tokens for max_new_tokens={budget}")
    logprobs: list[float] = []
    for i, (logprob, token_id, _text) in enumerate(entries):
        if token_id != ids[i] or logprob is None:
            raise violation(f"logprob entry {i} is ({logprob}, {token_id}) for token {ids[i]}")
        logprobs.append(logprob)
    return Generation(
        token_ids=ids,
        logprobs=logprobs,
        finish_reason=meta.finish_reason.type,  # type: ignore[arg-type]
        weight_version=parse_weight_version(meta.weight_version),
        prompt_tokens=meta.prompt_tokens or 0,
        cached_tokens=meta.cached_tokens or 0,
    )


def merge_pieces(
    pieces: Sequence[Generation], params: SamplingParams, *, prompt_tokens: int
) -> Generation:
    """Concatenate a generation resumed after aborts. The weight version is the oldest one that
    produced any token (conservative for staleness); prefix-cache figures are the first piece's."""
    tokens = [t for p in pieces for t in p.token_ids]
    finish = pieces[-1].finish_reason
    if finish == "abort" and len(tokens) >= params.max_new_tokens:
        finish = "length"
    elif finish == "abort" and tokens and tokens[-1] in params.stop_token_ids:
        finish = "stop"
    producing = [p for p in pieces if p.token_ids] or list(pieces[-1:])
    return Generation(
        token_ids=tokens,
        logprobs=[lp for p in pieces for lp in p.logprobs],
        finish_reason=finish,
        weight_version=min(p.weight_version for p in producing),
        prompt_tokens=pieces[0].prompt_tokens or prompt_tokens,
        cached_tokens=pieces[0].cached_tokens,
    )


def finished_anyway(tokens: Sequence[int], params: SamplingParams) -> bool:
    """An abort that landed after the budget was spent or a stop token was sampled."""
    if len(tokens) >= params.max_new_tokens:
        return True
    return bool(tokens) and tokens[-1] in params.stop_token_ids


def error_text(response: httpx.Response) -> str:
    """The message of an SGLang error body ({"error": {"message"}} or {"message"}), else text."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:500]
        if "message" in body:
            return str(body["message"])[:500]
    return response.text[:500]


def expect_status(response: httpx.Response, status: int, base_url: str) -> None:
    if response.status_code != status:
        raise EngineError(
            f"SGLang at {base_url}{response.request.url.path} answered HTTP "
            f"{response.status_code}: {error_text(response)}"
        )


def decode_ack(response: httpx.Response) -> Ack | None:
    """An Ack, or None for a body that is empty, `null`, or not an ack (older memory endpoints
    answer nothing; FastAPI validation errors answer another shape)."""
    try:
        return _ack_decoder.decode(response.content)
    except msgspec.DecodeError:
        return None


def json_object(response: httpx.Response, base_url: str) -> dict[str, Any]:
    expect_status(response, 200, base_url)
    path = response.request.url.path
    try:
        body = response.json()
    except ValueError as exc:
        raise EngineError(f"SGLang at {base_url}{path} sent non-JSON") from exc
    if not isinstance(body, dict):
        raise EngineError(f"SGLang at {base_url}{path} sent {body!r}")
    return body


def with_version(body: dict[str, Any], weight_version: int | str | None) -> dict[str, Any]:
    if weight_version is not None:
        body["weight_version"] = str(weight_version)  # Optional[str] in io_struct
    return body
