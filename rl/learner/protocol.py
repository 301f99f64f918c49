"""The messages between the driver and the learner ranks: one request and one reply per route.

What it is: the bodies `rl/learner_client.py` posts to every rank under `/learner/` and the
answers `rl/learner/rank.py` gives, as frozen Structs, and the route table (`STEP`, `SYNC`, ...)
that pairs each path with its two types and decodes replies with a decoder built once. A failed
command answers 500 with a `Failure`. `GET /health` names the run and the driver's start
(`HealthReply`), so the driver tells its own ranks from another run's on the same port. A step's
batch travels as a msgpack file next to the run (`encode_samples`), its path in the request.
What it is not: the transport (`rl/engine/http.py`) or what the commands do (`rl/learner/rank.py`).

Example:
    body = encode(StepRequest(kind="ppo", batch_path="RUN/batches/ppo_000003.msgpack"))
    reply = STEP.decode_reply(response.content)     # a StepReply
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

import msgspec
from msgspec import Struct

from rl.samples import Sample

Metrics = dict[str, float | None]
"""Figures of an update; null where the value is NaN (JSON has none), e.g. an undefined explained variance."""


class Empty(Struct, frozen=True, kw_only=True):
    """The body of a command without arguments, or the reply of one without results."""


class StepRequest(Struct, frozen=True, kw_only=True):
    """One update on the global batch stored at `batch_path`; each rank trains its share."""

    kind: Literal["ppo", "sft", "value"]
    batch_path: str
    lr_scale: float = 1.0
    """Multiplier of the learning rates (rft's `optim.sft_lr_schedule`)."""


class StepReply(Struct, frozen=True, kw_only=True):
    metrics: Metrics
    """Losses, gradient norms, tokens, `train_s`, `tokens_per_s` (and `mfu` on a known GPU)."""


class SyncReply(Struct, frozen=True, kw_only=True):
    """The actor's weights went to the engines (or were exported for them) at `version`."""

    version: int
    """The number of actor updates so far; generations record it as their weight version."""
    metrics: dict[str, float]
    """Seconds (`weight_sync_s`, or `export_s`), bytes and buckets of the push."""
    path: str | None = None
    """The exported actor, for SGLang servers that load it from disk (`sglang_disk`); None when
    the engines have the weights already."""


class SaveRequest(Struct, frozen=True, kw_only=True):
    """Checkpoint `step` (collective); with `export`, also the actor as a Hugging Face directory."""

    step: int
    extra: dict[str, Any] = {}
    """Stored with the checkpoint (the stage and step it ends)."""
    export: bool = False


class SaveReply(Struct, frozen=True, kw_only=True):
    metrics: dict[str, float] = {}
    """Seconds the save blocked training and (background saves) of the previous write."""


class LoadRequest(Struct, frozen=True, kw_only=True):
    run_dir: str
    """The run whose latest checkpoint to restore."""


class LoadReply(Struct, frozen=True, kw_only=True):
    found: bool
    step: int = 0
    """The step the checkpoint records: the next one to run."""
    extra: dict[str, Any] = {}


class ReleaseRequest(Struct, frozen=True, kw_only=True):
    """Free the colocated engine's memory for training (KV cache, CUDA graphs)."""

    weights: bool = False
    """Also a colocated SGLang server's weights (a weight sync follows and restores them)."""


class HealthReply(Struct, frozen=True, kw_only=True):
    """A rank is serving, and for which start of which run: the driver takes the rank as its own
    only when `launch_id` is the one it passed (another run's learner may hold the port)."""

    run_dir: str
    launch_id: str
    """The random token the driver passed to this start of the ranks (`--launch-id`); empty for a
    rank no driver started (benchmarks)."""


class InfoReply(Struct, frozen=True, kw_only=True):
    rank: int
    world_size: int
    device: str
    version: int
    optimizer_steps: int


class Failure(Struct, frozen=True, kw_only=True):
    """The 500 answer of a failed command: the exception and the traceback's tail."""

    message: str


Request = TypeVar("Request", bound=Struct)
Reply = TypeVar("Reply", bound=Struct)


class Route(Generic[Request, Reply]):
    """One learner command: its method and path, its request and reply types, and the decoder of
    its replies (built once)."""

    def __init__(self, method: str, path: str, request: type[Request], reply: type[Reply]) -> None:
        self.method, self.path, self.request, self.reply = method, path, request, reply
        self._decoder = msgspec.json.Decoder(reply)

    def decode_reply(self, data: bytes) -> Reply:
        return self._decoder.decode(data)

    def request_from(self, body: dict[str, Any]) -> Request:
        """The request from the JSON object the HTTP server decoded (`rl/engine/http.py`)."""
        return msgspec.convert(body, self.request)

    def __repr__(self) -> str:
        return f"Route({self.method} {self.path})"


STEP = Route("POST", "/learner/step", StepRequest, StepReply)
SYNC = Route("POST", "/learner/sync", Empty, SyncReply)
SAVE = Route("POST", "/learner/save", SaveRequest, SaveReply)
WAIT = Route("POST", "/learner/wait", Empty, SaveReply)
LOAD = Route("POST", "/learner/load", LoadRequest, LoadReply)
RELEASE = Route("POST", "/learner/release", ReleaseRequest, Empty)
RESUME = Route("POST", "/learner/resume", Empty, Empty)
INFO = Route("GET", "/learner/info", Empty, InfoReply)
HEALTH = Route("GET", "/health", Empty, HealthReply)
SHUTDOWN = Route("POST", "/learner/shutdown", Empty, Empty)

_encoder = msgspec.json.Encoder()
_failure = msgspec.json.Decoder(Failure)
_samples = msgspec.msgpack.Decoder(list[Sample])


def encode(message: Struct) -> bytes:
    """A request or reply as the JSON body of its route."""
    return _encoder.encode(message)


def failure_message(data: bytes) -> str:
    """What a failed answer says: a `Failure`'s message, else the body as text."""
    try:
        return _failure.decode(data).message
    except msgspec.DecodeError:
        return data.decode(errors="replace")


def encode_samples(samples: list[Sample]) -> bytes:
    """A step's batch, as the file `StepRequest.batch_path` names."""
    return msgspec.msgpack.encode(samples)


def decode_samples(data: bytes) -> list[Sample]:
    return _samples.decode(data)
