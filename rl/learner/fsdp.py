"""Data parallelism for the learner: process group, FSDP2 sharding, activation checkpointing.

What it is: the few calls that turn one actor or critic into a sharded module over the learner
ranks that torchrun launched. `init_distributed` joins the process group (NCCL on CUDA, gloo on
CPU; a one-rank group when there is no torchrun environment, so the same code runs alone).
`apply_activation_checkpointing` wraps each decoder block in a non-reentrant checkpoint wrapper;
`shard` then applies FSDP2 `fully_shard` to every block and to the root, with bf16 compute over
fp32 master weights and fp32 gradient reduction (torchtitan's recipe). `full_state_items` gathers
the full, unsharded weights bucket by bucket under their Hugging Face names, for weight sync to
the rollout engine and for export.

What it is not: the optimizer, the update (`rl.learner.update`) or checkpoints (`rl.learner.checkpoint`). No
tensor parallelism: the models this learner trains (0.5B-7B) fit one GPU's share under FSDP.

How it is used (every rank runs the same lines, in this order):

    dist = init_distributed()
    actor = build_actor(model_cfg, dist.device)
    apply_activation_checkpointing(actor, layers(actor))
    shard(actor, layers=layers(actor))
    opt = torch.optim.AdamW(actor.parameters(), lr=1e-6)  # after shard: it sees the DTensors
    for bucket in full_state_items(actor, 512 << 20):  # collective: every rank iterates
        engine.update_weights(bucket)
"""

from __future__ import annotations

import datetime
import functools
import os
import sys
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
from msgspec import Struct
from torch import nn
from torch.distributed.algorithms._checkpoint import checkpoint_wrapper as ckpt
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

# Prefixes that wrappers add to state-dict names; the HF name is what is left.
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


class DistConfig(Struct, frozen=True, kw_only=True):
    """How the learner ranks talk to each other."""

    backend: str = "auto"
    """"auto" = nccl when CUDA is available, else gloo."""
    timeout_s: float = 1800.0
    """Collective timeout (a rollout phase can keep ranks waiting at a barrier for minutes)."""


class Dist(Struct, frozen=True, kw_only=True):
    """This process's place among the learner ranks."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(cfg: DistConfig | None = None) -> Dist:
    """Join (or create) the default process group from torchrun's environment; idempotent.

    Without RANK/WORLD_SIZE in the environment this makes a one-rank group on an in-memory
    store, so that `fully_shard` and collectives work unchanged in a plain `python` run.
    """
    cfg = cfg or DistConfig()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = _device(local_rank)
    if not dist.is_initialized():
        backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        timeout = datetime.timedelta(seconds=cfg.timeout_s)
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend, timeout=timeout, device_id=_device_id(device))
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return Dist(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank, device=device)


def close_distributed(*, sync: bool = False) -> None:
    """Leave the process group (after the last collective; NCCL warns at exit otherwise).
    `sync`: a barrier first, so no rank tears its connections down while a peer still uses them
    (a gloo rank exiting early aborted a peer with "terminate called without an active exception").
    Only on a clean finish: with a peer gone the barrier would fail or wait for the timeout."""
    if dist.is_initialized():
        if sync and dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()


def end_rank_process(code: int = 0) -> None:
    """Exit a rank process at once, after flushing its output. A gloo rank that leaves through
    the interpreter's normal teardown can abort in a C++ destructor ("terminate called without
    an active exception") after its work is done and saved; nothing is left to clean up by then."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _device_id(device: torch.device) -> torch.device | None:
    # Binding the group to a GPU lets NCCL connect eagerly and silences its guess-the-device warning.
    return device if device.type == "cuda" else None


def apply_activation_checkpointing(module: nn.Module, layers: Sequence[nn.Module]) -> list[nn.Module]:
    """Wrap each block of `layers` in place with a non-reentrant checkpoint wrapper.

    Call before `shard`, so that FSDP2 shards the wrapper and the recomputation in backward
    runs inside the block's unshard/reshard window. Returns the wrappers, in order. The wrapper's
    state-dict hook strips `_checkpoint_wrapped_module.`, so names do not change.
    """
    targets = {id(block) for block in layers}
    wrap = functools.partial(ckpt.checkpoint_wrapper, checkpoint_impl=ckpt.CheckpointImpl.NO_REENTRANT)
    ckpt.apply_activation_checkpointing(module, checkpoint_wrapper_fn=wrap, check_fn=lambda m: id(m) in targets)
    wrappers = [m for m in module.modules() if isinstance(m, ckpt.CheckpointWrapper)]
    wrapped = {id(w._checkpoint_wrapped_module) for w in wrappers}
    missing = targets - wrapped
    if missing:
        raise ValueError(f"{len(missing)} of {len(targets)} layers are not submodules of the module")
    return [w for w in wrappers if id(w._checkpoint_wrapped_module) in targets]


def every_kth(layers: Sequence[nn.Module], k: int) -> list[nn.Module]:
    """The layers to checkpoint when only every k-th one is: layers k-1, 2k-1, ... (k >= 1), so
    the last layer, whose activations are needed first in backward, is always among them."""
    if k < 1:
        raise ValueError(f"checkpoint every k-th layer needs k >= 1, got {k}")
    return [layer for i, layer in enumerate(layers) if (len(layers) - 1 - i) % k == 0]


def compile_blocks(layers: Sequence[nn.Module]) -> None:
    """Compile each decoder block's own `forward` in place (Inductor fuses the norms, rotary,
    SiLU-gating and residual adds that otherwise run as dozens of small kernels per block).

    Only `forward` is replaced, not the module's call: the FSDP2 and checkpoint hooks around the
    block stay eager, and module names (checkpoints, HF export) do not change. All blocks share
    one code object, so they share the compiled graph; the packed length is dynamic from the
    start. Call before or after `apply_activation_checkpointing`, with the unwrapped blocks.
    """
    for block in layers:
        block.forward = torch.compile(block.forward, dynamic=True)


def shard(
    module: nn.Module,
    *,
    layers: Sequence[nn.Module],
    mixed_precision: bool = True,
    reshard_after_forward: bool = True,
    mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Apply FSDP2 to each decoder block, then to the root (embeddings, final norm, heads).

    One block per all-gather keeps peak memory at about one block's full weights beyond the
    shards. A block that sits inside a checkpoint wrapper is sharded through its wrapper.
    Mixed precision applies on CUDA only (CPU runs are tests, compared with fp32 references).
    Gradients are summed over ranks (see below), so a loss must be normalised by the global
    batch. Returns `module`, now an `FSDPModule`.
    """
    device = next(module.parameters()).device
    mesh = mesh or init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy()
    if mixed_precision and device.type == "cuda":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for part in [*_outermost(module, layers), module]:
        fully_shard(part, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
        # Sum, not average, gradients over ranks: each rank's loss is already divided by the
        # global batch's token count (rl.learner.ppo), so the sum is the global token mean. Forcing
        # plain SUM avoids NCCL's PREMUL_SUM, which gloo lacks.
        part.set_gradient_divide_factor(1.0)
        part.set_force_sum_reduction_for_comms(True)
    return module


def _outermost(module: nn.Module, layers: Sequence[nn.Module]) -> list[nn.Module]:
    """Each layer, or the checkpoint wrapper around it when there is one."""
    wrapper_of = {
        id(m._checkpoint_wrapped_module): m for m in module.modules() if isinstance(m, ckpt.CheckpointWrapper)
    }
    return [wrapper_of.get(id(block), block) for block in layers]


def hf_submodule(module: nn.Module) -> tuple[str, nn.Module | None]:
    """The outermost transformers `PreTrainedModel` in `module` and its state-dict prefix.

    ("lm.", the HF causal LM) for an Actor, ("backbone.", the HF base model) for a Critic,
    ("", module) for a bare HF model, ("", None) when there is none.
    """
    from transformers import PreTrainedModel

    for name, sub in module.named_modules():
        if isinstance(sub, PreTrainedModel):
            return (_strip_wrappers(f"{name}.") if name else ""), sub
    return "", None


def hf_name(name: str, prefix: str) -> str:
    """The HF state-dict name of a state-dict entry of the wrapping module."""
    name = _strip_wrappers(name)
    return name[len(prefix) :] if prefix and name.startswith(prefix) else name


def _strip_wrappers(name: str) -> str:
    for p in _WRAPPER_PREFIXES:
        name = name.replace(p, "")
    return name


@torch.no_grad()
def full_state_items(
    module: nn.Module, bucket_bytes: int, *, dtype: torch.dtype | None = None
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Yield the full (unsharded) state in buckets of about `bucket_bytes`, named as in HF.

    A collective: every rank must run the iteration to the end, since each sharded tensor is
    all-gathered (`DTensor.full_tensor`). Tensors stay on the parameters' device, cast to `dtype`
    when given. Tied weights (embeddings and lm_head) are gathered once and yielded under both
    names, sharing storage. Entries outside the HF model (a critic's value head) keep their own
    name. Buckets hold whole tensors, so one larger than `bucket_bytes` is a bucket of its own.
    """
    prefix, _ = hf_submodule(module)
    state = module.state_dict(keep_vars=True)  # keep_vars: tied params stay one object
    last_name = {id(value): name for name, value in state.items()}
    gathered: dict[int, torch.Tensor] = {}
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, value in state.items():
        key = id(value)
        if key not in gathered:
            full = value.full_tensor() if isinstance(value, DTensor) else value.detach()
            gathered[key] = full.to(dtype) if dtype is not None and full.is_floating_point() else full
            size += gathered[key].numel() * gathered[key].element_size()
        bucket.append((hf_name(name, prefix), gathered[key]))
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
        if last_name[key] == name:
            del gathered[key]  # no later name shares it: drop our reference
    if bucket:
        yield bucket

