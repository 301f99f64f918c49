"""The messages that cross a task, module or process boundary in agentcore.

Everything here is a frozen, kw_only `msgspec.Struct`: tasks, chat messages, tool calls and
tool results (tagged unions), turns, trajectories and groups of trajectories. Nothing here does
I/O or imports torch. Evolve a value with `msgspec.structs.replace`; decode with the typed
decoders at the bottom, built once.

Token bookkeeping (see `agentcore.chat`): a trajectory keeps the exact token ids the model was
shown and produced. `prompt_ids` is the first rendered prompt; `response_ids` is everything after
it, generated tokens and tool observations interleaved; `logprobs` and `loss_mask` run parallel
to `response_ids`, with mask 1 only on tokens the policy sampled.
"""

from __future__ import annotations

import enum
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

JsonScalar = str | int | float | bool | None


class Task(Struct, frozen=True, kw_only=True):
    """A KernelBench-format problem: `Model`, `get_inputs`, `get_init_inputs` in `source`."""

    task_id: str
    source: str
    name: str = ""
    level: int | None = None
    metadata: dict[str, JsonScalar] = {}


class Message(Struct, frozen=True, kw_only=True):
    """One chat message as the chat template sees it."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: str | None = None

    def as_dict(self) -> dict[str, str]:
        d = {"role": self.role, "content": self.content}
        if self.name is not None:
            d["name"] = self.name
        return d


# ---------------------------------------------------------------------------------------------
# Tool calls: one Struct per tool, tagged by the tool's name as the model writes it.


class Edit(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One exact-string replacement inside a file."""

    old_string: str
    new_string: str
    replace_all: bool = False


class _Call(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="tool"):
    pass


class Bash(_Call, tag="bash"):
    """Run a shell command in the sandboxed workspace."""

    command: str
    timeout_s: Annotated[float, Meta(gt=0, le=600)] = 120.0


class ReadFile(_Call, tag="read_file"):
    """Read a text file, `limit` lines from line `offset` (0-based)."""

    path: str
    offset: Annotated[int, Meta(ge=0)] = 0
    limit: Annotated[int, Meta(gt=0)] = 2000


class WriteFile(_Call, tag="write_file"):
    """Create or overwrite a file; an existing file must have been read first."""

    path: str
    content: str


class EditFile(_Call, tag="edit_file"):
    """Apply exact-string replacements to a file, all or none."""

    path: str
    edits: Annotated[tuple[Edit, ...], Meta(min_length=1)]


class Glob(_Call, tag="glob"):
    """List workspace files matching a glob pattern."""

    pattern: str


class Grep(_Call, tag="grep"):
    """Search file contents with a regular expression."""

    pattern: str
    path: str = "."
    glob: str | None = None


class Compile(_Call, tag="compile"):
    """Build kernels/*.cu and the bindings into the workspace's extension."""


class Verify(_Call, tag="verify"):
    """Check model_new.py against model.py on fresh random inputs."""


class Profile(_Call, tag="profile"):
    """Time model_new.py against eager PyTorch and torch.compile."""


class Finish(_Call, tag="finish"):
    """End the episode; the final workspace is what gets scored."""

    summary: str = ""


ToolCall = Bash | ReadFile | WriteFile | EditFile | Glob | Grep | Compile | Verify | Profile | Finish
TOOL_CALL_TYPES: tuple[type[_Call], ...] = ToolCall.__args__  # type: ignore[attr-defined]
TOOL_NAMES: tuple[str, ...] = tuple(t.__struct_config__.tag for t in TOOL_CALL_TYPES)


# ---------------------------------------------------------------------------------------------
# Tool results: text for the file tools, structured reports for the kernel tools.


class _Result(Struct, frozen=True, kw_only=True, tag_field="kind"):
    pass


class ToolOutput(_Result, tag="output"):
    """A tool ran; `text` is what the model sees (already truncated to its budget)."""

    text: str
    exit_code: int | None = None
    truncated: bool = False


class ToolErrorKind(enum.Enum):
    INVALID_CALL = "invalid_call"  # malformed or schema-violating call
    DENIED = "denied"  # protected file, path outside the workspace, read-before-write
    NOT_FOUND = "not_found"
    TIMEOUT = "timeout"
    FAILED = "failed"  # the tool itself could not run


class ToolError(_Result, tag="error"):
    """A call the tool refused or could not carry out; the model sees `message`."""

    error: ToolErrorKind
    message: str


class CompileResult(_Result, tag="compile"):
    """Outcome of building the workspace's kernels (a model failure is `ok=False`, not an exception)."""

    ok: bool
    log: str = ""
    seconds: float = 0.0
    cached_units: int = 0
    built_units: int = 0


class VerifyResult(_Result, tag="verify"):
    """Outcome of a correctness check; `hack` names a detected cheat category."""

    ok: bool
    message: str = ""
    trials: int = 0
    max_abs_err: float | None = None
    hack: str | None = None


class ProfileResult(_Result, tag="profile"):
    """Times in milliseconds: the candidate, eager PyTorch, torch.compile."""

    ok: bool
    message: str = ""
    candidate_ms: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None


ToolResult = ToolOutput | ToolError | CompileResult | VerifyResult | ProfileResult


# ---------------------------------------------------------------------------------------------
# Trajectories.


class Status(enum.Enum):
    COMPLETED = "completed"  # the model called finish
    TRUNCATED_LENGTH = "truncated_length"  # context budget spent
    TRUNCATED_TURNS = "truncated_turns"  # turn limit reached
    TIMEOUT = "timeout"  # wall budget spent
    PARSE_ERROR = "parse_error"  # too many consecutive invalid tool calls
    ENGINE_ERROR = "engine_error"  # the model server failed for good
    ABORTED = "aborted"  # cancelled by the orchestrator (shutdown, straggler)
    FAILED = "failed"  # our infrastructure failed for this trajectory (bug, broken tool); see error


INFRA_FAILURES = frozenset({Status.ENGINE_ERROR, Status.FAILED})
"""Stored endings that are not the model's doing: the model server, a sandbox, the compile pool
or the GPU queue failed. `cuda-agent rollout` reruns them when it resumes."""


FinishReason = Literal["stop", "length", "abort"]


class Turn(Struct, frozen=True, kw_only=True):
    """One model turn and the observations that followed it.

    Offsets index `Trajectory.response_ids`: generated tokens are [gen_start, gen_end), then
    template glue and tool observations up to obs_end.
    """

    index: int
    gen_start: int
    gen_end: int
    obs_end: int
    text: str
    finish_reason: FinishReason
    weight_version: int
    calls: tuple[ToolCall, ...] = ()
    results: tuple[ToolResult, ...] = ()
    parse_error: str | None = None
    gen_s: float = 0.0
    tool_s: float = 0.0


class Timings(Struct, frozen=True, kw_only=True):
    """Seconds spent in each phase of a trajectory."""

    generate_s: float = 0.0
    tools_s: float = 0.0
    total_s: float = 0.0


class Trajectory(Struct, frozen=True, kw_only=True):
    """A finished (or stopped) episode of one agent on one task."""

    trajectory_id: str
    task_id: str
    group_id: str
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    turns: list[Turn]
    status: Status
    weight_version_min: int
    weight_version_max: int
    timings: Timings
    error: str | None = None
    reward: float | None = None
    reward_info: dict[str, JsonScalar] = {}
    metadata: dict[str, JsonScalar] = {}

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)


class TrajectoryGroup(Struct, frozen=True, kw_only=True):
    """The n samples of one task, handed to the consumer together (GRPO/PPO batches)."""

    group_id: str
    task_id: str
    trajectories: list[Trajectory]


# Typed codecs, built once.
tool_call_decoder = msgspec.json.Decoder(ToolCall)
tool_call_converter = ToolCall  # for msgspec.convert(obj, ToolCall)
trajectory_decoder = msgspec.json.Decoder(Trajectory)
task_decoder = msgspec.json.Decoder(Task)
encoder = msgspec.json.Encoder()
