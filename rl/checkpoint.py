"""Training checkpoints that survive a kill at any instant, and export of the actor for serving.

What it is: `save` writes everything a resumed run needs - actor, critic, both optimizers
(sharded under FSDP2, through `torch.distributed.checkpoint`, so any world size saves and
loads), every rank's RNG streams, the step and the caller's data position (`extra`: the task
sampler's cursor, the ids of trajectories already consumed). `load_latest` puts it all back.
`export_hf` writes the actor as a plain Hugging Face model directory (config, safetensors,
generation config, tokenizer) that `AutoModelForCausalLM.from_pretrained` and SGLang load.

What it is not: a trajectory store (`agentcore.store`) or a weight sync to a live engine
(`rl.fsdp.full_state_items`).

Atomicity: a checkpoint is written into `RUN/ckpt/step_000123.tmp/`, completed by `meta.json`
(written last), then renamed to `RUN/ckpt/step_000123/`; `RUN/ckpt/latest` names it and is
replaced atomically (temp file + `os.replace`); that replacement is the commit point. A kill
leaves either the previous checkpoint or the new one, never half of one: a `.tmp` directory is
ignored and removed by the next load. All
ranks call `save`/`load_latest`/`export_hf` (they are collectives); rank 0 alone renames,
prunes and writes the shared files. Ranks share one filesystem (one host, or a shared mount).

Layout of one checkpoint:
    state/            DCP shards: {"actor": {"model", "optim"}, "critic": {"model", "optim"}}
    rng/rank_00000.pt python, numpy, torch CPU and this rank's CUDA generator states
    meta.json         {"step", "world_size", "extra"}

Example:
    checkpoint.save(run_dir, step, actor=actor, critic=critic, actor_opt=a_opt,
                    critic_opt=c_opt, extra={"cursor": sampler.cursor})
    found = checkpoint.load_latest(run_dir, actor=actor, critic=critic, actor_opt=a_opt, critic_opt=c_opt)
    start, extra = found if found else (0, {})
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import re
import shutil
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rl.fsdp import full_state_items, hf_submodule

_STEP_DIR = re.compile(r"^step_(\d+)$")
_EXPORT_BUCKET_BYTES = 256 << 20
# DCP writer threads per rank: one thread serialises ~0.5-1 GB/s, and a 0.5B actor + critic with
# AdamW is ~12 GB. DCP's own per-file fsync is off: `_publish` fsyncs every file once, in parallel.
_IO_THREADS = max(1, min(4, os.cpu_count() or 1))


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

    `extra` must be JSON-serialisable. A checkpoint of the same step that already exists is
    replaced. `timings`, when given, receives this rank's seconds per part (state_dict,
    dcp_write, rng, fsync, commit, prune; `bench/checkpoint.py` prints them). Returns the
    checkpoint directory.
    """
    clock = _Clock(timings)
    root = Path(run_dir) / "ckpt"
    final = root / f"step_{step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "rng").mkdir(parents=True)
    _barrier()
    state = _state(actor, critic, actor_opt, critic_opt)
    clock.lap("state_dict")
    with _single_process_quiet():
        writer = dcp.FileSystemWriter(tmp / "state", thread_count=_IO_THREADS, sync_files=False)
        dcp.save(state, storage_writer=writer, no_dist=_world_size() == 1)
    del state
    clock.lap("dcp_write")
    _write_atomic(tmp / "rng" / f"rank_{_rank():05d}.pt", _rng_bytes())
    clock.lap("rng")
    _barrier()
    if _rank() == 0:
        meta = {"step": step, "world_size": _world_size(), "extra": extra or {}}
        _write_atomic(tmp / "meta.json", orjson.dumps(meta))
        _fsync_tree(tmp)  # every rank's files: durable bytes before the rename publishes them
        clock.lap("fsync")
        _publish(tmp, final)
        clock.lap("commit")
        _prune(root, keep)
        clock.lap("prune")
    _barrier()
    return final


def load_latest(
    run_dir: str | os.PathLike[str],
    *,
    actor: nn.Module,
    critic: nn.Module | None = None,
    actor_opt: torch.optim.Optimizer | None = None,
    critic_opt: torch.optim.Optimizer | None = None,
) -> tuple[int, dict[str, Any]] | None:
    """Restore the newest complete checkpoint of `run_dir`; (step, extra), or None if there is none.

    Torn `.tmp` directories of a killed save are removed first. Modules or optimizers passed as
    None are not restored (e.g. start a new stage from another run's actor with fresh
    optimizers). RNG streams are restored when the checkpoint has a file for this rank.
    """
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
# Export


def export_hf(
    actor: nn.Module,
    tokenizer: Any,
    out_dir: str | os.PathLike[str],
    *,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_size: str = "5GB",
    timings: dict[str, float] | None = None,
) -> Path:
    """Write the actor's HF model as a standalone Hugging Face directory; a collective.

    `tokenizer` is a tokenizer or a local tokenizer directory; `dtype` is the dtype the weights
    are stored in and the one `config.json` declares (SGLang serves bf16). The directory is
    assembled under `out_dir.tmp` and renamed into place, so a reader never sees half of it.
    Every rank gathers; rank 0 writes. `timings` receives seconds per part (export_gather,
    export_write, export_tokenizer, export_commit). Returns `out_dir`.
    """
    from transformers import AutoModelForCausalLM

    clock = _Clock(timings)
    out_dir = Path(out_dir)
    _, hf = hf_submodule(actor)
    if hf is None:
        raise ValueError("export_hf: the actor holds no transformers PreTrainedModel")
    state = _gather_cpu(actor, dtype)
    clock.lap("export_gather")
    if _rank() == 0:
        config = copy.deepcopy(hf.config)
        config.dtype = dtype
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        _check_names(model, state)
        model.generation_config = copy.deepcopy(hf.generation_config)
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, state_dict=state, max_shard_size=max_shard_size)
        clock.lap("export_write")
        _tokenizer(tokenizer).save_pretrained(tmp)
        clock.lap("export_tokenizer")
        _replace_dir(tmp, out_dir)
        clock.lap("export_commit")
    _barrier()
    return out_dir


def _gather_cpu(actor: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The actor's full HF state on CPU (rank 0; empty elsewhere), one copy per name: tied
    embeddings and lm_head are both stored (readers such as `bench --watch` expect every name)."""
    state: dict[str, torch.Tensor] = {}
    for bucket in full_state_items(actor, _EXPORT_BUCKET_BYTES, dtype=dtype):
        if _rank() == 0:
            state.update((name, t.to("cpu", copy=True)) for name, t in bucket)
    return state


def _check_names(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    expected = set(model.state_dict())
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise ValueError(f"export_hf: names differ from the HF model: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")


def _tokenizer(tokenizer: Any) -> Any:
    if isinstance(tokenizer, (str, os.PathLike)):
        from agentcore.tiny_tokenizer import load_tokenizer  # any local HF tokenizer directory

        return load_tokenizer(tokenizer)
    return tokenizer


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


def _publish(tmp: Path, final: Path) -> None:
    """Rename a complete, fsynced `.tmp` directory into place, then point `latest` at it."""
    _replace_dir(tmp, final)
    _write_atomic(final.parent / "latest", final.name.encode())


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename `src` to `dst`; an existing `dst` is moved aside first and then deleted."""
    old = dst.with_name(dst.name + ".old")
    if dst.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dst, old)
    os.replace(src, dst)
    _fsync_dir(dst.parent)
    shutil.rmtree(old, ignore_errors=True)


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


def _remove_later(path: Path) -> None:
    doomed = path.with_name(path.name + ".del")
    shutil.rmtree(doomed, ignore_errors=True)
    os.replace(path, doomed)
    threading.Thread(target=shutil.rmtree, args=(doomed, True), name="ckpt-prune", daemon=True).start()


def _clean(root: Path) -> None:
    """Remove what killed saves left: torn `.tmp` directories, pruned `.del` ones, and `.old` ones moved aside
    (an `.old` whose replacement never arrived is moved back instead)."""
    for torn in [*root.glob("*.tmp"), *root.glob("*.del")]:
        shutil.rmtree(torn, ignore_errors=True)
    for old in root.glob("*.old"):
        target = old.with_name(old.name.removesuffix(".old"))
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(old, target)


def _complete_steps(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.match(path.name)
        if match and (path / "meta.json").is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_tree(path: Path) -> None:
    """Flush every file and directory under `path`, so the rename publishes durable bytes.

    Files are flushed in parallel: each fsync waits on the device, and the shards of one save
    are many GB (a directory fsync alone would not flush the files' data)."""
    files, dirs = [], []
    for dirpath, _, names in os.walk(path):
        files += [os.path.join(dirpath, name) for name in names]
        dirs.append(dirpath)
    with ThreadPoolExecutor(max_workers=_IO_THREADS) as pool:
        list(pool.map(_fsync_path, files))
    for d in dirs:
        _fsync_path(d)


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    _fsync_path(str(path))


class _Clock:
    """Seconds between laps, added into `timings` under each lap's name (nothing when None)."""

    def __init__(self, timings: dict[str, float] | None) -> None:
        self.timings, self.t = timings, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        if self.timings is not None:
            self.timings[name] = self.timings.get(name, 0.0) + now - self.t
        self.t = now


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """Silence DCP's warning that it runs without collectives: at world size 1 that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
