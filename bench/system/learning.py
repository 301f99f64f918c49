"""The learning check: PPO on a tiny random Qwen2 raises the reward of a verifiable toy task.

What it is: the learner exactly as training uses it (`build_actor`, `build_critic`, `ppo_step`
on packed `Sample`s) on a task a 2-layer model can learn in a few dozen steps. The prompt is
one fixed token; the policy generates `gen_tokens` tokens in two turns with one "tool output"
token between them (mask 0, so the masking path is exercised); the reward is the fraction of
generated tokens equal to `TARGET`. Sampling is a plain torch loop at `temperature` (1 by default)
that records the behaviour log-probs of softmax(logits / temperature), as the rollout engine would, and
PPO's policy is the same tempered distribution. Prints the reward curve.
What it is not: a speed benchmark (`bench/system/learner.py`) or a test (`tests/test_learning.py`
runs a short version of `train` and asserts the reward rose).

    python -m bench.system.learning [--steps 60] [--seed 0] [--batch 32] [--temperature 1] [--device cpu]

`--policy NAME` runs the other check instead, a pretrained policy on real kernel tasks against a
control (`bench.system.policy_learning`):

    python -m bench.system.learning --policy smollm2-135m --seeds 3 [--gpus 0,1,2] [--out DIR] [--set KEY=VALUE ...]

and with `--report` writes that check's report from the run directories already in --out (a run cut short and
copied back from its machine), training nothing.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from msgspec import Struct

from bench.system.policy_learning import main_policy, main_report
from rl.learner.models import ModelConfig, build_actor, build_critic, tiny_qwen2_config
from rl.learner.update import PPOConfig, ppo_step
from rl.samples import Sample

VOCAB = 16
PROMPT = 1  # the fixed prompt token
OBS = 2  # the "tool output" token between the two turns (not an action)
TARGET = 3  # the token the reward counts


class LearningConfig(Struct, frozen=True, kw_only=True):
    """The toy task and its optimiser."""

    steps: int = 60
    """PPO steps (one batch of fresh samples each)."""
    batch: int = 32
    """Samples per step."""
    gen_tokens: int = 8
    """Generated tokens per sample, split over two turns."""
    actor_lr: float = 2e-3
    """Adam learning rate of the actor."""
    critic_lr: float = 5e-3
    """Adam learning rate of the critic."""
    seed: int = 0
    """Seeds the model init and the sampler."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts and of PPO's policy."""


@torch.no_grad()
def sample_batch(actor, batch: int, gen_tokens: int, generator: torch.Generator,
                 temperature: float = 1.0) -> list[Sample]:
    """`batch` episodes from the current policy at `temperature`, with behaviour log-probs.
    `generator` lives on the actor's device."""
    device = generator.device
    ids = torch.full((batch, 1), PROMPT, dtype=torch.long, device=device)
    mask, logprobs = [0], [0.0]
    turn = gen_tokens // 2
    for k in range(gen_tokens + 1):
        if k == turn:  # the tool answers: a token the policy did not choose
            ids = torch.cat([ids, torch.full((batch, 1), OBS, dtype=torch.long, device=device)], dim=1)
            mask.append(0)
            logprobs.append(0.0)
            continue
        logits = actor.lm(input_ids=ids, use_cache=False).logits[:, -1].float()  # [B, V]
        logp = torch.log_softmax(logits / temperature, dim=-1)  # [B, V]
        token = torch.multinomial(logp.exp(), 1, generator=generator)  # [B, 1]
        ids = torch.cat([ids, token], dim=1)
        mask.append(1)
        logprobs.append(logp.gather(-1, token)[:, 0].tolist())
    ids_list = ids.tolist()
    return [_sample(i, ids_list[i], mask, [lp if isinstance(lp, float) else lp[i] for lp in logprobs])
            for i in range(batch)]  # fmt: skip


def _sample(i: int, token_ids: list[int], mask: list[int], logprobs: list[float]) -> Sample:
    actions = [t for t, m in zip(token_ids, mask) if m]
    return Sample(
        sample_id=str(i),
        group_id="toy",
        token_ids=token_ids,
        action_mask=list(mask),
        behaviour_logprobs=logprobs,
        reward=sum(t == TARGET for t in actions) / len(actions),
        weight_version=0,
    )


def train(cfg: LearningConfig, ppo: PPOConfig | None = None, *, device: str = "cpu", log=None) -> list[float]:
    """Run PPO on the toy task (default PPOConfig); the mean reward of each step's batch
    (sampled before that step's update)."""
    ppo = ppo or PPOConfig()
    # sdpa on CUDA too: flex_attention needs head_dim >= 16, and this model's is 8.
    hf = tiny_qwen2_config(vocab_size=VOCAB, hidden=32, intermediate=64)
    model = ModelConfig(hf_config=hf, attn_implementation="sdpa", seed=cfg.seed)
    actor, critic = build_actor(model, device), build_critic(model, device)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=cfg.actor_lr)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr)
    generator = torch.Generator(device).manual_seed(cfg.seed)
    curve = []
    for step in range(cfg.steps):
        samples = sample_batch(actor, cfg.batch, cfg.gen_tokens, generator, cfg.temperature)
        curve.append(sum(s.reward for s in samples) / len(samples))
        metrics = ppo_step(actor, critic, actor_opt, critic_opt, samples, ppo, device, temperature=cfg.temperature)
        if log is not None:
            log(step, curve[-1], metrics)
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0, help="the rollouts' and PPO's policy's")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--policy", default="toy",
                        help="toy (this module's task), or a model (smollm2-135m, an HF directory; tiny: the "
                             "CPU plumbing) for bench.system.policy_learning")
    parser.add_argument("--seeds", type=int, default=3, help="--policy: seeds, each a PPO run and its control")
    parser.add_argument("--out", default="runs/learning", help="--policy: output directory (a rerun resumes)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="--policy: dotted override of both runs, repeatable")
    parser.add_argument("--gpus", metavar="LIST",
                        help="--policy: GPUs (e.g. 0,1,2, or 0,0,0: three at once on one GPU) that run seeds at "
                             "once, one child process per entry (CUDA_VISIBLE_DEVICES); default: one seed after "
                             "another in this process")
    parser.add_argument("--port-base", type=int,
                        help="--gpus: the learner port of the first entry's seeds (the k-th: +16 k); default: a "
                             "free range drawn at random")
    parser.add_argument("--cpu", action="store_true",
                        help="--policy: the smoke_cpu recipe (fake kernel environment; plumbing only)")
    parser.add_argument("--report", action="store_true",
                        help="--policy: write the report from the run directories already in --out (a run cut "
                             "short), training nothing; give the run's own --seeds, --set and --cpu")
    args = parser.parse_args()
    if args.policy != "toy" and args.report:
        raise SystemExit(main_report(args.policy, args.seeds, Path(args.out), args.set, cpu=args.cpu))
    if args.policy != "toy":
        gpus = [g.strip() for g in args.gpus.split(",") if g.strip()] if args.gpus else None
        raise SystemExit(main_policy(args.policy, args.seeds, Path(args.out), args.set, cpu=args.cpu, gpus=gpus,
                                     port_base=args.port_base))
    torch.set_num_threads(1)

    def log(step: int, reward: float, m: dict[str, float]) -> None:
        print(
            f"step {step:3d}  reward {reward:.3f}  policy_loss {m['policy_loss']:+.4f}  "
            f"value_loss {m['value_loss']:.4f}  entropy {m['entropy']:.3f}  "
            f"explained_variance {m['explained_variance']:+.3f}  logprob_gap {m['logprob_gap']:.2g}",
            flush=True,
        )

    t0 = time.perf_counter()
    curve = train(LearningConfig(steps=args.steps, seed=args.seed, batch=args.batch, temperature=args.temperature),
                  device=args.device, log=log)
    k = max(1, len(curve) // 10)
    first, last = sum(curve[:k]) / k, sum(curve[-k:]) / k
    print(f"mean reward: first {k} steps {first:.3f}, last {k} steps {last:.3f} ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
