"""Pushing the learner's new weights to the engines that generate rollouts, after each update.

What it is: three ways to publish one weight version, each returning a `SyncReport`:
`sync_embedded` loads the buckets into the in-process engine (`rl.engine.embedded`);
`sync_tensor` posts them to a colocated SGLang server on the same GPU through
`/update_weights_from_tensor` with CUDA IPC handles (no bytes copied); `sync_disk` has each server
load a Hugging Face directory the caller wrote. `release` / `resume` free and restore a colocated
server's GPU memory around training. In `cuda-agent train` (`weight_sync.mode=sglang_tensor`)
learner rank r calls `sync_tensor` on the server on its GPU (`rl.learner.rank`); with
`sglang_disk` the driver (`rl.stages.sync_weights`) calls `sync_disk` after the ranks exported the actor.

What it is not: the gathering of full tensors from FSDP shards (`rl.learner.fsdp.full_state_items`
yields the buckets) nor the HTTP client (`agentcore.sglang.SGLangClient`).

Example (a colocated step, per learner rank and its server):
    await release(client, cfg)                          # pause, wait idle, free weights + KV
    ... train ...
    report = await sync_tensor(client, learner.weight_buckets(), version, cfg, released=True)
"""

from __future__ import annotations

import base64
import io
import pickle
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import anyio
from msgspec import Struct

from agentcore.engine import EngineError

if TYPE_CHECKING:
    import torch

    from agentcore.sglang import SGLangClient

Bucket = list[tuple[str, "torch.Tensor"]]
_DEVICE_ARG = 6  # index of the device in torch's CUDA reduce_tensor args (stable for years)


class WeightSyncConfig(Struct, frozen=True, kw_only=True):
    """How new weights reach the rollout engines."""

    mode: Literal["embedded", "sglang_tensor", "sglang_disk"] = "embedded"
    """embedded: in-process engine; sglang_tensor: colocated server (CUDA IPC); sglang_disk."""
    bucket_bytes: int = 512 * 2**20
    """Bytes of full tensors gathered and sent at once (sglang_tensor: two alive at the peak)."""
    pause_mode: Literal["abort"] = "abort"
    """SGLang pause mode: `abort` ends running requests (the client resumes them afterwards).
    SGLang's `retract` and `in_place` keep requests queued or running, and a server that holds
    any refuses the flush an update needs (and a weight update that flushes then kills it)."""
    flush_timeout_s: float = 120.0
    """How long to keep retrying a flush that SGLang refuses because requests still run."""
    flush_poll_s: float = 0.05
    """Wait between flush attempts."""
    cleanup_timeout_s: float = 60.0
    """Bound on the shielded continue_generation after a failure."""
    ipc_device: Literal["uuid", "index"] = "uuid"
    """How CUDA IPC payloads name the GPU: uuid (SGLang >= 0.4.6 patch) or the raw index."""
    check_version: bool = True
    """After an update, read /get_weight_version back and require the new version."""
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """sglang_tensor: dtype of the tensors sent (the server's; fp32 masters are cast per tensor)."""
    server_retry_s: float = 60.0
    """sglang_tensor: how long a learner rank retries a control call to a dead or 5xx server."""


class SyncReport(Struct, frozen=True, kw_only=True):
    """What one weight publication moved and how long it took."""

    version: int
    bytes: int
    buckets: int
    tensors: int
    seconds: float


class WeightSyncError(EngineError):
    """A weight publication failed; the engine may hold partly updated weights."""


# ---------------------------------------------------------------------------------------------
# Wire format.


# Wire format of `/update_weights_from_tensor` (SGLang `srt/utils` MultiprocessingSerializer and
# `model_runner.update_weights_from_tensor`, load_format None): `serialized_named_tensors` holds
# one base64 string per TP rank; each decodes to a pickle of `[(hf_name, tensor), ...]`. A CUDA
# tensor is pickled as torch.multiprocessing's IPC reduction (`rebuild_cuda_tensor` plus the
# memory handle); the device index in it is replaced by the GPU's UUID, as SGLang's
# `monkey_patch_torch_reductions` does, because the trainer and the server may number the GPUs
# differently (different CUDA_VISIBLE_DEVICES). A CPU tensor is pickled by value (slow: tests and
# non-colocated debugging only). Only torch and builtins globals appear in the pickle, which
# SGLang's restricted unpickler (CVE-2025-10164) accepts.
class _WirePickler(pickle.Pickler):
    """A pickler that sends CUDA tensors as IPC handles and everything else by value."""

    def __init__(self, file: io.BytesIO, ipc_device: str) -> None:
        super().__init__(file, protocol=pickle.DEFAULT_PROTOCOL)
        self.ipc_device = ipc_device

    def reducer_override(self, obj: Any) -> Any:
        import torch

        if isinstance(obj, torch.Tensor) and obj.is_cuda:
            return _reduce_cuda(obj, self.ipc_device)
        return NotImplemented


def _reduce_cuda(tensor: torch.Tensor, ipc_device: str) -> tuple[Any, tuple]:
    import torch
    from torch.multiprocessing import reductions

    rebuild, args = reductions.reduce_tensor(tensor.detach())
    if ipc_device == "uuid" and isinstance(args[_DEVICE_ARG], int):
        uuid = str(torch.cuda.get_device_properties(args[_DEVICE_ARG]).uuid)
        args = (*args[:_DEVICE_ARG], uuid, *args[_DEVICE_ARG + 1 :])
    return rebuild, args


def serialize_named_tensors(
    named: Sequence[tuple[str, torch.Tensor]], *, ipc_device: str = "uuid"
) -> str:
    """One TP rank's `serialized_named_tensors` entry: base64 of the pickled (name, tensor) list.
    The CUDA tensors must stay alive until the server has answered."""
    buf = io.BytesIO()
    _WirePickler(buf, ipc_device).dump([(name, tensor) for name, tensor in named])
    return base64.b64encode(buf.getvalue()).decode("ascii")


def return_device_memory() -> None:
    """Hand this process's free GPU memory back to the driver: the blocks torch keeps for CUDA IPC
    consumers that have let go of them (the server copied each bucket into its own parameters) and
    every free block of the caching allocator (training's activations, the gathered buckets). A
    colocated server resuming its weights or KV cache allocates through the driver, not through
    this process's allocator, and fails when this process still holds the memory it freed."""
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.ipc_collect()
        torch.cuda.empty_cache()


def bucket_bytes(bucket: Bucket) -> int:
    return sum(t.numel() * t.element_size() for _, t in bucket)


# ---------------------------------------------------------------------------------------------
# Buckets come from collectives on the GPU: pull them in a worker thread on the caller's device.


def _current_cuda_device() -> int | None:
    import torch

    return torch.cuda.current_device() if torch.cuda.is_initialized() else None


async def _in_thread(device: int | None, fn: Any, *args: Any) -> Any:
    def call() -> Any:
        if device is not None:  # a fresh worker thread would default to cuda:0
            import torch

            torch.cuda.set_device(device)
        return fn(*args)

    return await anyio.to_thread.run_sync(call)


async def _next_bucket(it: Iterator[Bucket], device: int | None) -> Bucket | None:
    """The next non-empty bucket, or None when the iterator is done."""
    while (bucket := await _in_thread(device, next, it, None)) is not None:
        if bucket:
            return bucket
    return None


async def _drain(it: Iterator[Bucket], device: int | None) -> None:
    """Run the bucket iterator to its end after a failure: gathering full tensors is a
    collective, and a rank that stopped early would leave the others waiting in an all-gather."""
    while await _in_thread(device, next, it, None) is not None:
        pass


class _Tally:
    """Counts what was sent, for the SyncReport."""

    def __init__(self) -> None:
        self.bytes = self.buckets = self.tensors = 0

    def add(self, bucket: Bucket) -> None:
        self.bytes += bucket_bytes(bucket)
        self.buckets += 1
        self.tensors += len(bucket)

    def report(self, version: int, started: float) -> SyncReport:
        return SyncReport(
            version=version,
            bytes=self.bytes,
            buckets=self.buckets,
            tensors=self.tensors,
            seconds=time.monotonic() - started,
        )


# ---------------------------------------------------------------------------------------------
# Embedded engine.


async def sync_embedded(engine: Any, buckets: Iterable[Bucket], version: int) -> SyncReport:
    """Load every bucket into the in-process engine (`rl.engine.embedded`) in place, as one
    update: `begin_update` holds new requests and waits for the running batch, each bucket goes
    through `load_bucket`, and `end_update(version)` lets generation go on with the new weights
    (a failure ends the update keeping the old version, and re-raises)."""
    started, device = time.monotonic(), _current_cuda_device()
    it, tally, ok = iter(buckets), _Tally(), False
    await engine.begin_update()
    try:
        while (bucket := await _next_bucket(it, device)) is not None:
            await engine.load_bucket(bucket)
            tally.add(bucket)
        ok = True
    except Exception:
        await _drain(it, device)
        raise
    finally:
        engine.end_update(version if ok else None)
    return tally.report(version, started)


# ---------------------------------------------------------------------------------------------
# SGLang.


async def flush_until_idle(client: SGLangClient, cfg: WeightSyncConfig) -> None:
    """Flush the radix cache, retrying while SGLang refuses because requests still run."""
    with anyio.move_on_after(cfg.flush_timeout_s):
        while not await client.flush_cache():
            await anyio.sleep(cfg.flush_poll_s)
        return
    raise WeightSyncError(
        f"SGLang at {client.base_url} stayed busy for {cfg.flush_timeout_s:.0f}s: cache not flushed"
    )


async def release(
    client: SGLangClient,
    cfg: WeightSyncConfig = WeightSyncConfig(),
    tags: Sequence[str] | None = None,
    releasing: Callable[[], None] | None = None,
) -> None:
    """Before training on a shared GPU: pause generation, wait until the server is idle, then
    free its memory (`tags` among weights, kv_cache, cuda_graph; None frees all). The server
    stays paused; `sync_tensor(..., released=True)` restores it. `releasing` is called right
    before the release request, once the server is idle: from then on the tags may be released
    (SGLang kills the server that is asked to resume a tag it never released)."""
    await client.pause_generation(cfg.pause_mode)
    await flush_until_idle(client, cfg)
    if releasing is not None:
        releasing()
    await client.release_memory_occupation(tags)


async def resume(client: SGLangClient, tags: Sequence[str] | None = None) -> None:
    """Restore memory freed by `release` (None: all of it)."""
    await client.resume_memory_occupation(tags)


async def sync_tensor(
    client: SGLangClient,
    buckets: Iterable[Bucket],
    version: int,
    cfg: WeightSyncConfig = WeightSyncConfig(),
    *,
    released: bool = False,
    tp_size: int = 1,
) -> SyncReport:
    """Publish `version` to a colocated SGLang server, in the order slime and verl use: pause
    generation -> flush the radix cache (retried while SGLang answers 400 busy) -> one POST per
    bucket, the weight version on the last -> flush -> continue generation. The continue runs
    shielded in a `finally`, so a failed update still lets generation go on and the error
    reaches the caller. Looking one bucket ahead to know which POST is the last keeps two
    buckets (2 x bucket_bytes) alive at the peak, each until the server has loaded it.

    `released`: the server's memory was freed by `release`; its weights come back before the
    update and its KV cache and CUDA graphs after it, before generation continues. `tp_size`:
    each of the server's TP ranks gets its own pickle of this GPU's handles and copies from it
    (one server per GPU is the intended layout). Raises WeightSyncError; generation is continued in every case, and after
    a failure the buckets are still run to the end (see `_drain`)."""
    started, device, it = time.monotonic(), _current_cuda_device(), iter(buckets)
    ok = False
    try:
        await client.pause_generation(cfg.pause_mode)
        if released:
            await _in_thread(device, return_device_memory)
            await resume(client, ["weights"])
        await flush_until_idle(client, cfg)
        tally = await _post_buckets(client, it, version, cfg, tp_size, device)
        await _in_thread(device, return_device_memory)
        await flush_until_idle(client, cfg)
        if released:
            await resume(client, ["kv_cache", "cuda_graph"])
        ok = True
    except Exception as exc:
        await _drain(it, device)
        if isinstance(exc, WeightSyncError) or not isinstance(exc, EngineError):
            raise
        raise WeightSyncError(f"weight sync of version {version} to {client.base_url}: {exc}") from exc
    finally:
        await _continue(client, cfg, quiet=not ok)
    if cfg.check_version:
        await _check_version(client, version)
    return tally.report(version, started)


async def _continue(client: SGLangClient, cfg: WeightSyncConfig, *, quiet: bool) -> None:
    """Let generation go on, shielded and bounded; after a failure a failing continue (a dead
    server) must not hide the error that caused it."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(cfg.cleanup_timeout_s):
        try:
            await client.continue_generation()
        except EngineError:
            if not quiet:
                raise


async def _post_buckets(
    client: SGLangClient,
    it: Iterator[Bucket],
    version: int,
    cfg: WeightSyncConfig,
    tp_size: int,
    device: int | None,
) -> _Tally:
    """One POST per bucket; looks one bucket ahead because the version goes with the last."""
    tally = _Tally()
    upcoming = await _next_bucket(it, device)
    if upcoming is None:
        raise WeightSyncError(f"weight sync of version {version}: no tensors to send")
    while upcoming is not None:
        bucket, upcoming = upcoming, await _next_bucket(it, device)
        # one pickle per TP rank: each rank opens only its own handles, and torch counts every
        # pickled handle's consumer (a payload shared by ranks would be released too early)
        serialize = partial(serialize_named_tensors, bucket, ipc_device=cfg.ipc_device)
        payloads = await _in_thread(device, lambda f=serialize: [f() for _ in range(tp_size)])
        last_version = version if upcoming is None else None
        await _post_bucket(client, payloads, last_version, tally.buckets, version)
        tally.add(bucket)
        del bucket, payloads  # loaded by the server: its IPC handles may be released
    return tally


async def _post_bucket(
    client: SGLangClient,
    payloads: list[str],
    weight_version: int | None,
    index: int,
    version: int,
) -> None:
    try:
        await client.update_weights_from_tensor(payloads, flush_cache=False, weight_version=weight_version)
    except EngineError as exc:
        raise WeightSyncError(
            f"weight sync of version {version} to {client.base_url} failed at bucket {index}: {exc}"
        ) from exc


async def sync_disk(
    clients: Sequence[SGLangClient],
    model_path: str,
    version: int,
    cfg: WeightSyncConfig = WeightSyncConfig(),
) -> SyncReport:
    """Have every server load the HF directory `model_path` as `version`, all at once. Every
    server is tried to the end (cancelling a load halfway helps nobody); failures are raised
    together as one WeightSyncError."""
    started = time.monotonic()
    failures: list[str] = []

    async def one(client: SGLangClient) -> None:
        try:
            await client.update_weights_from_disk(model_path, weight_version=version)
            if cfg.check_version:
                await _check_version(client, version)
        except EngineError as exc:
            failures.append(f"{client.base_url}: {exc}")

    async with anyio.create_task_group() as tg:
        for client in clients:
            tg.start_soon(one, client)
    if failures:
        raise WeightSyncError(
            f"{len(failures)}/{len(clients)} server(s) could not load {model_path} as version "
            f"{version}: " + "; ".join(failures)
        )
    return SyncReport(
        version=version, bytes=0, buckets=0, tensors=0, seconds=time.monotonic() - started
    )


async def _check_version(client: SGLangClient, version: int) -> None:
    seen = await client.get_weight_version()
    if seen != version:
        raise WeightSyncError(
            f"SGLang at {client.base_url} reports weight version {seen} after loading {version}"
        )
