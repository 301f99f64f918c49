"""One learner rank: the FSDP2-sharded actor and critic, their optimizers, and the embedded
engine replica colocated on the same GPU.

What it is: the synchronous, torch-side half of a rank. Every method is a collective: all ranks
call it in the same order (the driver sends each command to every rank), and each runs in a
worker thread of the rank's event loop (`rl/learner/rank.py`) so the HTTP server stays responsive.
What it is not: the process or the HTTP routes (`rl/learner/rank.py`), the math (`rl/learner/update.py`), or
the driver (`rl/learner_client.py`).

Example (inside a rank, world size 1 on CPU):
    learner = Learner.build(cfg, init_distributed())
    metrics = learner.step("ppo", samples)
    learner.publish_weights(load)        # -> engine, weight version + 1
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from rl.config import TrainConfig
from rl.engine.batch import GREEDY_TEMPERATURE
from rl.learner import checkpoint, perf
from rl.learner.fsdp import Dist, apply_activation_checkpointing, compile_blocks, every_kth, full_state_items, shard
from rl.learner.models import build_actor, build_critic, layers
from rl.learner.packing import balance
from rl.learner.update import compute_logprobs, ppo_step, sft_step, value_step
from rl.samples import Sample

log = logging.getLogger("cuda-agent.learner")

Bucket = list[tuple[str, torch.Tensor]]


class Learner:
    """Actor + critic + optimizers of one rank (see module docstring)."""

    def __init__(self, cfg: TrainConfig, dist: Dist, actor, critic) -> None:
        self.cfg, self.dist, self.actor, self.critic = cfg, dist, actor, critic
        o = cfg.optim
        fused = {"fused": True} if o.fused and dist.device.type == "cuda" else {}
        self.actor_opt = torch.optim.AdamW(actor.parameters(), lr=o.actor_lr, betas=o.betas, weight_decay=o.weight_decay,
                                           **fused)
        self.critic_opt = torch.optim.AdamW(critic.parameters(), lr=o.critic_lr, betas=o.betas,
                                            weight_decay=o.weight_decay, **fused)
        self.version = 0
        self.optimizer_steps = 0
        self.actor_updates = 0  # ppo and sft steps: what a weight version counts
        self.reference = None  # frozen initial actor for the KL penalty (built on first use)
        self.saver = checkpoint.Saver(background=cfg.checkpoint.background)

    @classmethod
    def build(cls, cfg: TrainConfig, dist: Dist) -> Learner:
        _seed_everything(cfg.seed)  # same init on every rank before sharding
        actor = build_actor(cfg.model, dist.device)
        critic = build_critic(cfg.model, dist.device)
        for module in (actor, critic):
            if cfg.model.compile_blocks and dist.device.type == "cuda":
                compile_blocks(layers(module))
            if cfg.model.gradient_checkpointing:
                apply_activation_checkpointing(module, every_kth(layers(module), cfg.model.checkpoint_every))
            shard(module, layers=layers(module), mixed_precision=dist.device.type == "cuda",
                  reshard_after_forward=cfg.model.reshard_after_forward)
        _seed_everything(cfg.seed + 1000 * dist.rank)  # sampling/dropout streams differ per rank
        return cls(cfg, dist, actor, critic)

    # -- updates ------------------------------------------------------------------------------

    def step(self, kind: str, samples: list[Sample], lr_scale: float = 1.0) -> dict[str, float]:
        """One update of `kind` (ppo | sft | value) on this rank's share of `samples`, with the
        learning rates times `lr_scale` (a schedule the stage computes)."""
        t0 = time.perf_counter()
        self._set_lr(kind, lr_scale)
        device, ppo = self.dist.device, self.cfg.ppo
        samples = balance(samples, self.dist.world_size, self.dist.rank)  # this rank's share, by tokens
        if kind == "ppo":
            temperature = policy_temperature(self.cfg.rollout.temperature)
            demos = [s for s in samples if s.demonstration]  # rft's samples beside the rollouts (ppo.sft_coef)
            samples = [s for s in samples if not s.demonstration]
            ref = (compute_logprobs(self._reference(), samples, ppo, device, temperature=temperature)
                   if ppo.kl_coef > 0 else None)
            metrics = ppo_step(self.actor, self.critic, self.actor_opt, self.critic_opt, samples, ppo, device,
                               ref_logprobs=ref, temperature=temperature, demonstrations=demos)
        elif kind == "sft":
            metrics = sft_step(self.actor, self.actor_opt, samples, ppo, device)
        elif kind == "value":
            metrics = value_step(self.critic, self.critic_opt, samples, ppo, device)
        else:
            raise ValueError(f"unknown update kind {kind!r}")
        self.optimizer_steps += 1
        self.actor_updates += kind != "value"  # a value step trains the critic only
        metrics["train_s"] = time.perf_counter() - t0
        metrics["lr_actor"] = float(self.actor_opt.param_groups[0]["lr"])
        return metrics | self._throughput(kind, samples, metrics) | _memory(device)

    def _throughput(self, kind: str, samples: list[Sample], metrics: dict[str, float]) -> dict[str, float]:
        """tokens/s of the update (all ranks) and, on a GPU of the peak table, its MFU (rl.learner.perf)."""
        seconds, device = metrics["train_s"], self.dist.device
        if seconds <= 0:
            return {}
        out = {"tokens_per_s": float(metrics.get("tokens", 0.0)) / seconds}
        peak = perf.peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
        if peak is None:
            return out
        updates = self.cfg.ppo.updates_per_batch if kind == "ppo" else 1
        head = perf.action_positions([s.action_mask for s in samples]) if self.cfg.model.head_on_actions_only else None
        flops = torch.tensor(perf.update_flops(self.actor.lm.config.to_dict(), [len(s.token_ids) for s in samples],
                                               kind, updates, head_tokens=head), dtype=torch.float64, device=device)
        if self.dist.world_size > 1:
            torch.distributed.all_reduce(flops)  # this rank's share -> the update's
        return out | {"mfu": float(flops) / (seconds * peak * self.dist.world_size)}

    def _reference(self):
        """The KL reference: the actor when the first PPO step of this process ran (the stage's
        starting policy; after --resume, the resumed one). The paper keeps KL off; the option is
        for runs that want it. Built lazily, sharded like the actor, never trained."""
        if self.reference is None:
            ref = build_actor(self.cfg.model, self.dist.device)
            for name, t in self._gathered_actor():
                if _is_param(ref.lm, name):
                    ref.lm.get_parameter(name).data.copy_(t)
            ref.requires_grad_(False)
            shard(ref, layers=layers(ref), mixed_precision=self.dist.device.type == "cuda")
            self.reference = ref
        return self.reference

    def _gathered_actor(self):
        for bucket in self.weight_buckets():
            yield from bucket

    def _set_lr(self, kind: str, scale: float = 1.0) -> None:
        o = self.cfg.optim
        warm = scale * (min(1.0, (self.optimizer_steps + 1) / o.warmup_steps) if o.warmup_steps else 1.0)
        actor_lr = o.sft_lr if kind == "sft" else o.actor_lr
        for group in self.actor_opt.param_groups:
            group["lr"] = actor_lr * warm
        for group in self.critic_opt.param_groups:
            group["lr"] = o.critic_lr * warm

    # -- weights out --------------------------------------------------------------------------

    def weight_buckets(self) -> Iterable[Bucket]:
        """Full (unsharded) actor tensors under their Hugging Face names, bucket by bucket.
        A collective: every rank iterates it to the end."""
        return full_state_items(self.actor, self.cfg.weight_sync.bucket_bytes)

    def publish_weights(self, load: Callable[[Bucket], None]) -> dict[str, float]:
        """Gather the actor and hand each bucket to `load` (the engine's in-place loader); the
        new weight version is the number of actor updates so far."""
        t0 = time.perf_counter()
        nbytes = 0
        for bucket in self.weight_buckets():
            load(bucket)
            nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
        self.version = self.actor_updates
        return {"weight_sync_s": time.perf_counter() - t0, "weight_sync_bytes": float(nbytes), "version": self.version}

    # -- checkpoints --------------------------------------------------------------------------

    def save(self, run_dir: Path, step: int, extra: dict, export_dir: Path | None = None) -> dict[str, float]:
        """Checkpoint `step` (and export the actor to `export_dir`); with `checkpoint.background`
        returns once the state is staged. Metrics: this save's blocking seconds, and the
        background seconds of the previous save (finished by now: at most one is in flight)."""
        extra = dict(extra, version=self.version, optimizer_steps=self.optimizer_steps,
                     actor_updates=self.actor_updates)
        t0 = time.perf_counter()
        previous = self.saver.wait()
        self.saver.save(
            run_dir, step, actor=self.actor, critic=self.critic,
            actor_opt=self.actor_opt, critic_opt=self.critic_opt, extra=extra,
            keep=self.cfg.checkpoint.keep, export_dir=export_dir, tokenizer=self.cfg.data.tokenizer,
        )
        metrics = {"checkpoint_save_s": time.perf_counter() - t0}
        if previous:
            metrics["checkpoint_background_s"] = previous["background"]
        return metrics

    def wait_saved(self) -> dict[str, float]:
        """Block until the background save in flight is committed; its seconds per part."""
        return self.saver.wait()

    def close(self) -> dict[str, float]:
        """Finish the save in flight (a failure raises here, naming its step)."""
        return self.saver.close()

    def load(self, run_dir: Path) -> tuple[int, dict] | None:
        self.saver.wait()  # a save in flight commits first: it may be the latest checkpoint
        found = checkpoint.load_latest(
            run_dir, actor=self.actor, critic=self.critic, actor_opt=self.actor_opt, critic_opt=self.critic_opt
        )
        if found is not None:
            step, extra = found
            self.version = int(extra.get("version", step))
            self.optimizer_steps = int(extra.get("optimizer_steps", step))
            self.actor_updates = int(extra.get("actor_updates", self.version))
        return found

    def export(self, out_dir: Path, tokenizer_dir: str) -> None:
        checkpoint.export_hf(self.actor, tokenizer_dir, out_dir)


def _is_param(module: torch.nn.Module, name: str) -> bool:
    try:
        module.get_parameter(name)
        return True
    except AttributeError:
        return False


def policy_temperature(rollout_temperature: float) -> float:
    """The temperature of PPO's policy, softmax(logits / t): the rollouts' own, the distribution
    their tokens and behaviour log-probs come from; 1 for greedy rollouts, whose engines report
    log-probs at temperature 1."""
    return rollout_temperature if rollout_temperature >= GREEDY_TEMPERATURE else 1.0


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _memory(device: torch.device) -> dict[str, float]:
    """GiB this rank's process held on its GPU at most since the previous update (the update's own
    peak, or its engine's between updates) and caches now; the peak restarts here."""
    if device.type != "cuda":
        return {}
    out = {"gpu_peak_gib": torch.cuda.max_memory_allocated(device) / 2**30,
           "gpu_reserved_gib": torch.cuda.memory_reserved(device) / 2**30}
    torch.cuda.reset_peak_memory_stats(device)
    return out
