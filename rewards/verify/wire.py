"""What crosses the pipe between the trusted verifier and the candidate child, and how.

What it is: the msgspec messages of the verification protocol (`Load`, `Trial`, `Bye` from the
parent `rewards.verify.verifier`; `Loaded`, `TrialReport` from the child `rewards.verify.candidate`), the
observations a report carries (`Snapshot`, `OutputInfo`, `KernelEvent`), `Pipe` (length-prefixed
msgpack frames on two fds, with a receive timeout), and blob files for tensors (`BlobWriter`,
`write_state`, `read_tensor`): tensors never travel inside a frame, only a `TensorRef` naming a
file, offset, dtype and shape. `lock_file_size` keeps a child that runs candidate code under the
lane's file-size limit.

What it is not: no policy. The child only observes and reports; every decision is made by the
parent from these observations (`rewards.verify.judge`). Nothing in a report is trusted beyond what the
parent can check itself (outputs are compared against its own reference; input fingerprints
against its own inputs).

How it is used: the protocol, one child per candidate:

    parent  Load(task, candidate files, state_dict blobs)  ->  child builds ModelNew
    child   Loaded(snapshots)                              ->  parent draws hidden trial seeds
    parent  Trial(seed, variant, poison, ...)  (repeated)  ->  child draws the inputs with the
    child   TrialReport(outputs as blobs, audit, probes)       same `rewards.verify.inputs` code, runs
    parent  Bye                                                 forward, reports

Importing this module does not import torch (the orchestrator imports it through
`rewards.verify.verifier`); the blob functions import it when called.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import select
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec
from msgspec import Struct

from rewards.queue.jobs import HEADER, MAX_FRAME_BYTES, frame

BLOB_ALIGN = 64  # offsets of tensors inside a blob file: any dtype's view is aligned


class TensorRef(Struct, frozen=True, kw_only=True):
    """A tensor's bytes at `offset` in blob file `file` (relative to the transfer dir)."""

    file: str
    offset: int
    nbytes: int
    dtype: str  # torch dtype name without the "torch." prefix
    shape: tuple[int, ...]


# ---------------------------------------------------------------------------------------------
# Parent -> child.


class _ParentMsg(Struct, frozen=True, kw_only=True, tag_field="msg"):
    pass


class Load(_ParentMsg, tag="load"):
    """Build ModelNew: load the extension, import model_new.py, construct, load the state."""

    task_source: str  # the trusted model.py text: the child draws inputs with its get_inputs
    candidate_dir: str  # holds model_new.py; the child's cwd
    so_path: str  # the built extension, "" for a pure-PyTorch candidate
    device: str
    init_inputs: str  # repr() of get_init_inputs(), read back with ast.literal_eval
    init_seed: int
    state: dict[str, TensorRef]
    transfer_dir: str
    harness_stream: str = "side"  # "side": a fresh torch stream; "default": the default stream


class Trial(_ParentMsg, tag="trial"):
    """Run forward once on inputs drawn from (seed, variant, scale) by `rewards.verify.inputs`."""

    index: int  # trial number; the runs of a poison pair share it
    run: int  # forward call number in this session
    seed: int
    variant: str
    scale: float
    reuse_buffers: bool  # copy the new inputs into the previous trial's tensors (same pointers)
    poison: int | None  # byte pattern for the caching allocator's free memory, None: no poison
    expected_nbytes: tuple[int, ...]  # output sizes of the reference: sizes of poisoned blocks
    audit: bool  # run under the dispatch audit
    profile: bool  # run under torch.profiler (GPU) and report kernel events
    share_cuda: bool = False  # send CUDA outputs by IPC (CudaShare) instead of blob files
    probe: str = ""  # a name in rewards.verify.inputs.PROBES: clear those mantissa bits of the inputs


class Bye(_ParentMsg, tag="bye"):
    """End the session; the child exits."""


ParentMessage = Load | Trial | Bye


# ---------------------------------------------------------------------------------------------
# Child -> parent.


class Snapshot(Struct, frozen=True, kw_only=True):
    """Process state the candidate must not change: torch flags, identities, threads, children."""

    flags: dict[str, str]
    identities: dict[str, int]
    threads: int  # threading.active_count()
    native_threads: int  # entries of /proc/self/task (report only: CUDA and torch start some)
    children: tuple[int, ...]  # pids whose parent is the child


class CudaShare(Struct, frozen=True, kw_only=True):
    """A CUDA output shared by IPC instead of a blob file (`torch.UntypedStorage._share_cuda_()`):
    the parent maps the child's allocation, copies it at once and unmaps it. No file, no trip
    through host memory: a 6.4 GB output costs one device copy instead of seconds of disk."""

    device: int
    handle: bytes
    size_bytes: int
    offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes | None = None
    event_sync_required: bool = False
    storage_offset: int = 0  # elements, of the (contiguous) tensor in the shared storage


class OutputInfo(Struct, frozen=True, kw_only=True):
    """One output of forward as the child saw it; `data` is None when it was not sent."""

    type_name: str
    plain: bool  # type(out) is torch.Tensor
    device: str
    dtype: str
    shape: tuple[int, ...]
    has_storage: bool
    aliases_input: bool
    data: TensorRef | None = None
    cuda: CudaShare | None = None  # instead of `data`, when the parent asked for IPC


class KernelEvent(Struct, frozen=True, kw_only=True):
    """A GPU activity of the profiled forward (chrome-trace `cat`: kernel, gpu_memcpy, gpu_memset)."""

    name: str
    cat: str
    stream: int
    dur_us: float


class _ChildMsg(Struct, frozen=True, kw_only=True, tag_field="msg"):
    pass


class Loaded(_ChildMsg, tag="loaded"):
    ok: bool
    error: str = ""
    pid: int = 0
    before: Snapshot | None = None  # harness set up, candidate not yet imported
    after: Snapshot | None = None  # ModelNew built and on the device
    state: str = ""  # how the reference's state_dict reached ModelNew (candidate.load_state)
    phases_ms: dict[str, float] = {}  # the child's own start-up account (rewards.verify.phases)


class TrialReport(_ChildMsg, tag="report"):
    index: int
    run: int
    ok: bool  # forward returned (False: `error` says why)
    error: str = ""
    outputs: tuple[OutputInfo, ...] = ()
    input_fingerprints: tuple[str, ...] = ()  # of the drawn inputs, before forward
    inputs_changed: tuple[int, ...] = ()  # positions of inputs forward wrote into
    ops: dict[str, int] = {}  # dispatch audit: "aten.relu.default" -> calls
    after: Snapshot | None = None  # compared with Loaded.before, the pre-import baseline
    fp_stream: tuple[str, ...] = ()  # output fingerprints after the current stream's work
    fp_device: tuple[str, ...] = ()  # ... and after a device-wide synchronize
    prev_changed: bool = False  # the previous run's outputs changed during this run
    prev_same_storage: bool = False  # an output shares storage with a previous run's output
    kernels: tuple[KernelEvent, ...] = ()
    marker_stream: int | None = None  # stream of the harness's marker kernel (profiled runs)
    poisoned: bool = False
    forward_ms: float = 0.0
    phases_ms: dict[str, float] = {}  # the child's own account of this run (rewards.verify.phases)


ChildMessage = Loaded | TrialReport

parent_decoder = msgspec.msgpack.Decoder(ParentMessage)
child_decoder = msgspec.msgpack.Decoder(ChildMessage)
_encoder = msgspec.msgpack.Encoder()


# ---------------------------------------------------------------------------------------------
# Framing on two fds.


class ChildGone(RuntimeError):
    """The other end closed the pipe or sent an unreadable frame."""


class Pipe:
    """Frames on a read fd and a write fd; `receive` waits at most `timeout_s`."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd

    def send(self, message: Struct) -> None:
        view = memoryview(frame(_encoder.encode(message)))
        try:
            while view:
                view = view[os.write(self.write_fd, view) :]
        except (BrokenPipeError, OSError) as exc:
            raise ChildGone(f"pipe closed: {exc}") from exc

    def receive(self, decoder: msgspec.msgpack.Decoder, timeout_s: float | None = None) -> Any:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        header = self._read_exactly(HEADER.size, deadline)
        (size,) = HEADER.unpack(header)
        if size > MAX_FRAME_BYTES:
            raise ChildGone(f"frame of {size} bytes: the channel is corrupted")
        try:
            return decoder.decode(self._read_exactly(size, deadline))
        except msgspec.DecodeError as exc:
            raise ChildGone(f"unreadable frame: {exc}") from exc

    def _read_exactly(self, size: int, deadline: float | None) -> bytes:
        chunks, left = [], size
        while left:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([self.read_fd], [], [], remaining)[0]:
                    raise TimeoutError("no answer in time")
            chunk = os.read(self.read_fd, min(left, 1 << 20))
            if not chunk:
                raise ChildGone("end of file")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------
# Blob files: tensors by reference.


class BlobWriter:
    """Appends tensors to one file in `directory`; `add` returns where each went."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory, self.name = Path(directory), name
        self._file = open(self.directory / name, "wb")
        self._offset = 0

    def add(self, tensor) -> TensorRef:
        import torch

        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        pad = -self._offset % BLOB_ALIGN
        if pad:
            self._file.write(b"\0" * pad)
            self._offset += pad
        nbytes = t.numel() * t.element_size()
        if nbytes:
            self._file.write(t.reshape(-1).view(torch.uint8).numpy().data)
        ref = TensorRef(
            file=self.name, offset=self._offset, nbytes=nbytes, dtype=dtype_name(t.dtype), shape=tuple(t.shape)
        )
        self._offset += nbytes
        return ref

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def blob_nbytes(tensors) -> int:
    """The size of the blob file a BlobWriter makes of `tensors`."""
    size = 0
    for t in tensors:
        size += -size % BLOB_ALIGN + t.numel() * t.element_size()
    return size


def write_state(directory: Path, state: Mapping[str, Any]) -> dict[str, TensorRef]:
    """The reference's state_dict as the blob file "state.bin", for the child to load. The
    harness must write it whatever its size (KernelBench's L3 2_ShallowWideMLP has 8 GiB of
    weights), so this trusted process lifts its RLIMIT_FSIZE soft limit to the blob's size for the
    write and puts it back: the lane's limit (`rewards.queue.worker --max-file-mib`) is what
    candidate code gets."""
    need = blob_nbytes(state.values())
    with _file_size_at_least(need, "the reference's state_dict"), BlobWriter(directory, "state.bin") as writer:
        return {key: writer.add(t) for key, t in state.items()}


@contextlib.contextmanager
def _file_size_at_least(nbytes: int, what: str) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft == resource.RLIM_INFINITY or nbytes <= soft:
        yield
        return
    if hard != resource.RLIM_INFINITY and nbytes > hard:
        raise OSError(errno.EFBIG, f"{what} needs a file of {nbytes / 2**20:.0f} MiB, past this process's "
                      f"hard RLIMIT_FSIZE of {hard / 2**20:.0f} MiB")
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def lock_file_size() -> None:
    """Make this process's RLIMIT_FSIZE soft limit its hard limit too. A child that runs
    candidate code calls this before it loads any: the candidate (and whatever it starts) can then
    neither write a file past the lane's limit nor lift it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, soft))


def share_cuda(tensor) -> CudaShare:
    """The IPC description of a contiguous CUDA tensor; keep the tensor alive until the parent
    has copied it."""
    (device, handle, size, offset, counter, counter_offset, event, sync) = tensor.untyped_storage()._share_cuda_()
    return CudaShare(device=device, handle=handle, size_bytes=size, offset_bytes=offset, ref_counter_handle=counter,
                     ref_counter_offset=counter_offset, event_handle=event, event_sync_required=sync,
                     storage_offset=tensor.storage_offset())


def open_cuda(share: CudaShare, dtype_text: str, shape: tuple[int, ...], device):
    """A private copy, on `device`, of the tensor a child shared; ValueError when the share does
    not describe such a tensor (a lying child) or names another GPU."""
    import torch

    dtype = torch_dtype(dtype_text)
    numel = 1
    for n in shape:
        numel *= n
    elsize = torch.empty((), dtype=dtype).element_size()
    if share.storage_offset < 0 or (share.storage_offset + numel) * elsize > share.size_bytes:
        raise ValueError(f"shared output of {share.size_bytes} bytes cannot hold {tuple(shape)} {dtype_text}")
    if torch.device(device).index not in (None, share.device):
        raise ValueError(f"shared output is on cuda:{share.device}, not {device}")
    storage = torch.UntypedStorage._new_shared_cuda(
        share.device, share.handle, share.size_bytes, share.offset_bytes, share.ref_counter_handle,
        share.ref_counter_offset, share.event_handle, share.event_sync_required)
    view = torch.empty(0, dtype=dtype, device=storage.device)
    view.set_(storage, share.storage_offset, tuple(shape))
    copy = view.clone()
    del view, storage  # unmaps, and the child's ref counter drops
    return copy


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str):
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


def read_tensor(directory: Path, ref: TensorRef):
    """The CPU tensor `ref` names (a private copy-on-write mapping of the blob file)."""
    import torch

    dtype = torch_dtype(ref.dtype)
    if ref.nbytes == 0:
        return torch.empty(ref.shape, dtype=dtype)
    path = Path(directory) / ref.file
    if "/" in ref.file or not path.is_file():
        raise ValueError(f"no blob file {ref.file!r}")
    total = ref.offset + ref.nbytes
    if path.stat().st_size < total:
        raise ValueError(f"blob {ref.file!r} is shorter than {total} bytes")
    raw = torch.from_file(str(path), shared=False, size=total, dtype=torch.uint8)
    return raw[ref.offset : total].view(dtype).reshape(ref.shape)
