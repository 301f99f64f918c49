"""Training checkpoints that survive a kill at any instant, and export of the actor for serving.

What it is: `save` writes everything a resumed run needs - actor, critic, both optimizers
(sharded under FSDP2, through `torch.distributed.checkpoint`, so any world size saves and
loads), every rank's RNG streams, the step and the caller's data position (`extra`: the task
sampler's cursor, the ids of trajectories already consumed); `load_latest` puts it all back;
`Saver(background=True)` does the same behind training. `export_hf` (`rl.learner.hf_export`,
re-exported here) writes the actor as a Hugging Face model directory that
`AutoModelForCausalLM.from_pretrained` and SGLang load. All ranks call these (they are
collectives); rank 0 alone renames, prunes and writes the shared files, on one filesystem.

What it is not: a trajectory store (`agentcore.store`) or a weight sync to a live engine
(`rl.weight_sync`). How a kill is survived, and the layout on disk: at `save`.

Example:
    checkpoint.save(run_dir, step, actor=actor, critic=critic, actor_opt=a_opt,
                    critic_opt=c_opt, extra={"cursor": sampler.cursor})
    found = checkpoint.load_latest(run_dir, actor=actor, critic=critic, actor_opt=a_opt, critic_opt=c_opt)
    start, extra = found if found else (0, {})
"""

from __future__ import annotations

import functools
import logging
import os
import random
import shutil
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rl.learner.checkpoint_files import (
    _IO_THREADS,
    _barrier,
    _clean,
    _Clock,
    _complete_steps,
    _fsync_tree,
    _rank,
    _remove_later,
    _replace_dir,
    _single_process_quiet,
    _world_size,
)
from rl.learner.hf_export import _Export, _gather_export, export_hf

log = logging.getLogger("cuda-agent.checkpoint")


def save(
    run_dir: str | os.PathLike[str],
    step: int,
    *,
    actor: nn.Module,
    critic: nn.Module | None = None,
    actor_opt: torch.optim.Optimizer | None = None,
    critic_opt: torch.optim.Optimizer | None = None,
    extra: dict[str, Any] | None = None,
    keep: int = 3,
    timings: dict[str, float] | None = None,
) -> Path:
    """Write checkpoint `step` atomically, point `latest` at it and keep the newest `keep`.

    Atomicity: a checkpoint is written into `RUN/ckpt/step_000123.tmp/`, completed by `meta.json`
    (written last), then renamed to `RUN/ckpt/step_000123/`; `RUN/ckpt/latest` names it and is
    replaced atomically (temp file + `os.replace`); that replacement is the commit point. A kill
    leaves either the previous checkpoint or the new one, never half of one: a `.tmp` directory
    is ignored and removed by the next load. `Saver(background=True)` keeps these guarantees
    with the write, fsync, commit and export behind training. Layout of one checkpoint:

        state/            DCP shards: {"actor": {"model", "optim"}, "critic": {"model", "optim"}}
        rng/rank_00000.pt python, numpy, torch CPU and this rank's CUDA generator states
        meta.json         {"step", "world_size", "extra"}

    `extra` must be JSON-serialisable. A checkpoint of the same step that already exists is
    replaced. `timings`, when given, receives this rank's seconds per part (state_dict,
    dcp_write, rng, fsync, commit, prune; `bench/system/checkpoint.py` prints them). Returns the
    checkpoint directory.
    """
    clock = _Clock(timings)
    tmp, final = _begin(run_dir, step)
    state = _state(actor, critic, actor_opt, critic_opt)
    clock.lap("state_dict")
    with _single_process_quiet():
        dcp.save(state, storage_writer=_writer(tmp), no_dist=_world_size() == 1)
    del state
    clock.lap("dcp_write")
    _write_atomic(tmp / "rng" / f"rank_{_rank():05d}.pt", _rng_bytes())
    clock.lap("rng")
    _barrier()
    if _rank() == 0:
        _commit(tmp, final, _meta(step, extra), keep, clock)
    _barrier()
    return final


def _begin(run_dir: str | os.PathLike[str], step: int) -> tuple[Path, Path]:
    """A fresh `step_N.tmp/` (rank 0 makes it, all wait); returns (tmp, final)."""
    final = Path(run_dir) / "ckpt" / f"step_{step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "rng").mkdir(parents=True)
    _barrier()
    return tmp, final


def _writer(tmp: Path) -> dcp.FileSystemWriter:
    return dcp.FileSystemWriter(tmp / "state", thread_count=_IO_THREADS, sync_files=False)


def _meta(step: int, extra: dict[str, Any] | None) -> bytes:
    return orjson.dumps({"step": step, "world_size": _world_size(), "extra": extra or {}})


def _commit(tmp: Path, final: Path, meta: bytes, keep: int, clock: _Clock) -> None:
    """Rank 0, once every rank's files are in `tmp`: meta.json, fsync, rename + `latest`, prune."""
    _write_atomic(tmp / "meta.json", meta)
    _fsync_tree(tmp)  # every rank's files: durable bytes before the rename publishes them
    clock.lap("fsync")
    _publish(tmp, final)
    clock.lap("commit")
    _prune(final.parent, keep)
    clock.lap("prune")


def load_latest(
    run_dir: str | os.PathLike[str],
    *,
    actor: nn.Module,
    critic: nn.Module | None = None,
    actor_opt: torch.optim.Optimizer | None = None,
    critic_opt: torch.optim.Optimizer | None = None,
) -> tuple[int, dict[str, Any]] | None:
    """Restore the newest complete checkpoint of `run_dir` (or `run_dir` itself when it is one
    checkpoint directory, RUN/ckpt/step_N); (step, extra), or None if there is none.

    Torn `.tmp` directories of a killed save are removed first. Modules or optimizers passed as
    None are not restored (e.g. start a new stage from another run's actor with fresh
    optimizers). RNG streams are restored when the checkpoint has a file for this rank.
    """
    if (Path(run_dir) / "state").is_dir():  # one checkpoint directory (RUN/ckpt/step_N), not a run's
        return load(run_dir, actor=actor, critic=critic, actor_opt=actor_opt, critic_opt=critic_opt)
    root = Path(run_dir) / "ckpt"
    if _rank() == 0 and root.is_dir():
        _clean(root)
    _barrier()
    path = latest_dir(run_dir)
    if path is None:
        return None
    return load(path, actor=actor, critic=critic, actor_opt=actor_opt, critic_opt=critic_opt)


def load(
    path: str | os.PathLike[str],
    *,
    actor: nn.Module,
    critic: nn.Module | None = None,
    actor_opt: torch.optim.Optimizer | None = None,
    critic_opt: torch.optim.Optimizer | None = None,
) -> tuple[int, dict[str, Any]]:
    """Restore one checkpoint directory (see `load_latest`); returns (step, extra)."""
    path = Path(path)
    state = _state(actor, critic, actor_opt, critic_opt)
    with _single_process_quiet():
        dcp.load(state, checkpoint_id=path / "state", no_dist=_world_size() == 1)
    for name, module, opt in (("actor", actor, actor_opt), ("critic", critic, critic_opt)):
        if module is not None:
            optims = [opt] if opt is not None else []
            set_state_dict(
                module, optims, model_state_dict=state[name]["model"], optim_state_dict=state[name].get("optim", {})
            )
    rng = path / "rng" / f"rank_{_rank():05d}.pt"
    if rng.exists():
        _set_rng(torch.load(rng, weights_only=True))
    meta = orjson.loads((path / "meta.json").read_bytes())
    return int(meta["step"]), meta["extra"]


def latest_dir(run_dir: str | os.PathLike[str]) -> Path | None:
    """The checkpoint `latest` names; without a valid pointer, the highest complete step.

    The pointer wins over a higher step directory: a save killed between its rename and the
    pointer update did not commit. The scan covers a pointer lost or pointing at a directory
    removed by hand.
    """
    root = Path(run_dir) / "ckpt"
    pointer = root / "latest"
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if (named / "meta.json").is_file():
            return named
    steps = _complete_steps(root)
    return steps[-1][1] if steps else None


# ---------------------------------------------------------------------------------------------
# Background saves


class CheckpointError(RuntimeError):
    """A background save failed; raised by the next `Saver.save`, `wait` or `close`."""


class Saver:
    """The checkpoints of one learner: blocking, or (`background`) written behind training.

    A background `save` runs the collectives of a save in the caller's thread - the sharded state
    dict, DCP's staging copy of it into host memory (`dcp.async_save`), the HF export's gather -
    and returns; one thread then waits for DCP's write, writes the RNG file, and rank 0 fsyncs,
    commits (`latest`), prunes and writes the HF directory. The collectives of that thread run on
    a gloo group of their own, so they never interleave with the training group's. Commit order,
    atomicity and the kill guarantees are those of `save`. At most one save is in flight: the
    next `save`, `wait` and `close` wait for it, and raise CheckpointError naming its step if it
    failed on any rank. Staging holds a copy of this rank's checkpoint shard in host memory.

    Example:
        saver = Saver(background=True)
        saver.save(run_dir, step, actor=actor, critic=critic, actor_opt=a_opt, critic_opt=c_opt,
                   export_dir=run_dir / "hf", tokenizer=tokenizer_dir)   # returns once staged
        ...                                                              # train on
        finished = saver.wait()   # seconds per background part, "background" their sum
        saver.close()
    """

    def __init__(self, *, background: bool = False) -> None:
        self.background = background
        self._group: dist.ProcessGroup | None = None
        self._pending: tuple[int, Future[dict[str, float]]] | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-commit") if background else None

    def save(self, run_dir: str | os.PathLike[str], step: int, *, actor: nn.Module, critic: nn.Module | None = None,
             actor_opt: torch.optim.Optimizer | None = None, critic_opt: torch.optim.Optimizer | None = None,
             extra: dict[str, Any] | None = None, keep: int = 3, export_dir: str | os.PathLike[str] | None = None,
             tokenizer: Any = None, timings: dict[str, float] | None = None) -> Path:
        """`save`, then `export_hf(actor, tokenizer, export_dir)` when `export_dir` is given; in
        the background, `timings` gets the blocking parts (state_dict, stage, export_gather)."""
        self.wait()
        if not self.background:
            final = save(run_dir, step, actor=actor, critic=critic, actor_opt=actor_opt, critic_opt=critic_opt,
                         extra=extra, keep=keep, timings=timings)
            if export_dir is not None:
                export_hf(actor, tokenizer, export_dir, timings=timings)
            return final
        clock = _Clock(timings)
        tmp, final = _begin(run_dir, step)
        state = _state(actor, critic, actor_opt, critic_opt)
        clock.lap("state_dict")
        group = self._collective_group()
        with _single_process_quiet():
            staged = dcp.async_save(state, storage_writer=_writer(tmp), process_group=group,
                                    no_dist=_world_size() == 1)
        upload = getattr(staged, "upload_completion", staged)  # a Future, or torch's AsyncSaveResponse
        del state, staged
        rng = _rng_bytes()
        clock.lap("stage")
        job = None
        if export_dir is not None:
            job = _gather_export(actor, tokenizer, export_dir, torch.bfloat16, "5GB")
            clock.lap("export_gather")
        commit = functools.partial(self._finish, upload, tmp, final, _meta(step, extra), rng, keep, job)
        self._pending = (step, self._thread.submit(commit))
        return final

    def wait(self) -> dict[str, float]:
        """Block until the save in flight is committed; its background seconds per part ({} if
        none was in flight). Raises CheckpointError naming the step if it failed."""
        if self._pending is None:
            return {}
        step, future = self._pending
        self._pending = None
        try:
            return future.result()
        except Exception as exc:
            raise CheckpointError(f"background save of checkpoint step {step} failed: {exc!r}") from exc

    def close(self) -> dict[str, float]:
        """`wait`, then stop the thread."""
        try:
            return self.wait()
        finally:
            if self._thread is not None:
                self._thread.shutdown(wait=True)

    def _collective_group(self) -> dist.ProcessGroup | None:
        """The background thread's gloo group (made on the first save: all ranks call it)."""
        if not dist.is_initialized():  # DCP warns from its own thread, out of _single_process_quiet's reach
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        elif self._group is None:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def _finish(self, upload: Future, tmp: Path, final: Path, meta: bytes, rng: bytes, keep: int,
                job: _Export | None) -> dict[str, float]:
        """The background thread: every rank's files, then rank 0's commit and export. Each
        phase ends in an exchange of errors, so every rank raises when any rank failed."""
        timings: dict[str, float] = {}
        clock, t0 = _Clock(timings), time.perf_counter()
        error = None
        try:
            upload.result()
            clock.lap("dcp_write")
            _write_atomic(tmp / "rng" / f"rank_{_rank():05d}.pt", rng)
            clock.lap("rng")
        except Exception as exc:  # noqa: BLE001 - every rank learns of it, then raises
            error = exc
        _raise_if_any(self._group, error, "writing")  # also the barrier before rank 0 commits
        if _rank() == 0:
            try:
                _commit(tmp, final, meta, keep, clock)
                if job is not None:
                    job.write(clock)
            except Exception as exc:  # noqa: BLE001 - every rank learns of it, then raises
                error = exc
        _raise_if_any(self._group, error, "committing")
        timings["background"] = time.perf_counter() - t0
        log.info("checkpoint %s committed in the background in %.1f s", final.name, timings["background"])
        return timings


def _raise_if_any(group: dist.ProcessGroup | None, error: Exception | None, what: str) -> None:
    """Raise on every rank if `error` is set on any (a collective on `group`)."""
    errors = [repr(error) if error is not None else None]
    if group is not None and dist.get_world_size(group) > 1:
        errors = [None] * dist.get_world_size(group)
        dist.all_gather_object(errors, repr(error) if error is not None else None, group=group)
    failed = {rank: e for rank, e in enumerate(errors) if e is not None}
    if failed:
        raise RuntimeError(f"{what} failed on rank(s) {sorted(failed)}: {'; '.join(failed.values())}") from error


# ---------------------------------------------------------------------------------------------
# State, RNG and files


def _state(actor, critic, actor_opt, critic_opt) -> dict[str, dict[str, Any]]:
    """The DCP state tree; sharded DTensors under FSDP2, plain tensors otherwise."""
    state = {}
    for name, module, opt in (("actor", actor, actor_opt), ("critic", critic, critic_opt)):
        if module is None:
            continue
        model_sd, optim_sd = get_state_dict(module, [opt] if opt is not None else [])
        state[name] = {"model": model_sd, "optim": optim_sd} if opt is not None else {"model": model_sd}
    return state


def _rng_bytes() -> bytes:
    """This rank's RNG states as plain types (loadable with `weights_only=True`)."""
    import io

    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device: this rank's GPU
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def _set_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _prune(root: Path, keep: int) -> None:
    """Drop all but the newest `keep` complete checkpoints (keep <= 0: keep all).

    Each is renamed to `step_N.del` (instant, and no longer a complete step), then deleted in
    a background thread: removing GBs of shards took seconds of the save. A kill leaves the
    `.del` directory, which the next load removes."""
    if keep <= 0:
        return
    latest = latest_dir(root.parent)
    for _, path in _complete_steps(root)[:-keep]:
        if path != latest:
            _remove_later(path)


def _publish(tmp: Path, final: Path) -> None:
    """Rename a complete, fsynced `.tmp` directory into place, then point `latest` at it."""
    _replace_dir(tmp, final)
    _write_atomic(final.parent / "latest", final.name.encode())


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


