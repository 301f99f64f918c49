"""Named runs: Python functions that return a whole `TrainConfig`.

    smoke       - the README's main job: SmolLM2-135M (pretrained; `rl.pretrained`) on the
                  `rl.data.families` tasks: rejection fine-tuning on teacher trajectories driven
                  through the real tools, value pretraining, then a few PPO steps with real
                  compile / verify / profile on one GPU, and the held-out split evaluated before
                  rft, after rft and after ppo;
    learning    - the smoke under its own name and run directory, for
                  `bench.system.policy_learning`;
    smoke_cpu   - a machine without a GPU: a tiny random model on two bundled demonstration
                  tasks, learner on CPU, the fake kernel environment (nothing compiled or timed),
                  4 RFT steps; `cuda-agent train`'s default there;
    single_gpu  - a real model on one GPU: learner, engine and verification share it (timing is
                  less stable than with an exclusive verification GPU); `cuda-agent train`'s
                  default on a machine with a GPU;
    node_8gpu   - the paper's layout on one 8-GPU node: learner + colocated engines on GPUs 0-5,
                  verification and profiling exclusive on GPUs 6-7; global batch 1024.
    node_4gpu,  - the same layout scaled down (what the lent 2- and 4-GPU machines can run):
    node_2gpu     learner + engines on GPUs 0-2 / 0, verification exclusive on GPU 3 / 1, the
                  global batch scaled with the learner GPUs; a 0.5B model on two GPUs.
Each takes no arguments; the command line applies dotted overrides on top
(`cuda-agent train --recipe single_gpu --set model.path=/models/qwen --set steps.ppo=50`).
"""

from __future__ import annotations

from typing import Callable

import msgspec

from agentcore.orchestrator import OrchestratorConfig
from agentcore.rollout import RolloutConfig
from rewards.env import EnvConfig
from rl.config import (
    CheckpointConfig,
    DataConfig,
    EngineSection,
    LayoutConfig,
    OptimConfig,
    StepsConfig,
    TrainConfig,
)
from rl.engine.embedded import EmbeddedEngineConfig
from rl.learner.models import ModelConfig, qwen2_config, tiny_qwen2_config
from rl.learner.update import PPOConfig

TINY_VOCAB = 1792  # the built-in tiny tokenizer (1757 tokens) rounded up to a multiple of 64


def smoke() -> TrainConfig:
    """On a GPU: SmolLM2-135M learns kernels of `rl.data.families` tasks; held-out rows before
    rft, after rft and after ppo."""
    return TrainConfig(
        recipe="smoke",
        run_dir="runs/smoke",
        stage="smoke",
        model=ModelConfig(path="smollm2-135m", gradient_checkpointing=False, attn_implementation="sdpa"),
        # Two PPO batches must move the policy enough to show in greedy decoding: one update per
        # batch at actor lr 2e-6 left 17 of 17 held-out answers unchanged in two of three seeds
        # (H200). Four clipped updates per batch at 1e-5 reuse each batch's rollouts, the slow part.
        # lam 1: each action's advantage is the sample's reward minus the critic's value there.
        # The code is written in one turn of ~1,150 tokens followed by ~56 action tokens of later
        # turns; at lam 0.95 the reward reached the write turn's last token with weight 0.057 at
        # the median and its first with ~1e-24 (288 PPO samples of the learning benchmark, H200),
        # so the code learned only the critic's token-to-token differences.
        # baseline group: each sample's advantage is its reward minus its group's mean. At lam 1
        # with the critic (3 value steps, explained variance ~0) the advantage was the reward
        # itself: groups whose 4 samples all failed (7 of 54) or all passed (16) pushed their
        # nearly deterministic answers (entropy ~0.02 nats a token) down or up alike, and the
        # held-out answers that changed flipped single tokens of the template (`b[i % cols]` ->
        # `b[i / cols]`), mostly from right to wrong (PPO - control -0.22 +- 0.11, 3 seeds, H200).
        # With the group's mean only the 31 mixed groups teach, by what their samples did differently.
        ppo=PPOConfig(token_budget=16384, updates_per_batch=4, lam=1.0, baseline="group"),
        # rft sees every training teacher (66: each trained op at three shapes) at a higher rate
        # falling linearly: greedy held-out write turns after it were right for 10 of 17 (9 of 9 new
        # shapes and compositions, 1 of 8 unseen ops; `bench.system.rft_probe`, H200). Sixteen
        # teachers at 2e-5 taught the template, not the op -> expression mapping: 0 of 17.
        optim=OptimConfig(actor_lr=1e-5, critic_lr=1e-5, sft_lr=1e-4, sft_lr_schedule="linear"),
        steps=StepsConfig(rft=60, value=3, ppo=2),
        # Shapes of ~0.1 ms eager time: each verifies and times in about a second. The rft
        # collection is the teachers alone (one trajectory each; H200: ~20 s to build each, 8
        # builds at a time).
        data=DataConfig(tasks="families", family_target_ms=0.1, demos=66, rft_policy_rollouts=False,
                        tasks_per_step=4, samples_per_task=4, collect_tasks=2, heldout=True),
        # A teacher's write turn (all solution files in one reply) is up to ~1,800 tokens; SmolLM2
        # reads 8k. Four turns reach read, write, compile, verify: the final evaluation scores the
        # workspace however the trajectory ends, and the untrained model's held-out rollouts (no
        # tool call, every turn to the token limit) run alongside the rft collection (H200, 1,536
        # new tokens a turn: 2.5 min).
        rollout=RolloutConfig(max_turns=4, max_new_tokens=2048, max_context_tokens=8192,
                              tool_timeout_s=600.0, seed=0),
        # Four verification lanes share the GPU (each job ~1 s of mostly host work); a timing job
        # still has the GPU alone. One lane left 15 of 16 teachers waiting for verification.
        orchestrator=OrchestratorConfig(workers=32, model_slots=32, compile_slots=8, gpu_slots=4),
        # The precompiled header and the fixed binding build while the model starts.
        kernel_env=msgspec.structs.replace(EnvConfig(), lanes_per_gpu=4, warm_compile=True),
        # Static decode (fixed shapes replayed as CUDA graphs): a PPO write turn of ~1,150 tokens
        # at 16 sequences took 11 s with it (H200, three seeds' engines sharing the GPU), 24 s for
        # ~1,000 at 17 without it (alone). A static path that fails turns itself off.
        engine=EngineSection(embedded=EmbeddedEngineConfig(max_batch_size=32, static_decode=True)),
        checkpoint=CheckpointConfig(every_steps=1000, keep=2, export_hf=True),
        env="real",
    )


def learning() -> TrainConfig:
    """The smoke under its own name and run directory, with PPO on the training tasks of shape s1,
    which rft does not teach (`data.ppo_shapes`): the recipe of `bench.system.policy_learning`,
    where the held-out pass rate after rft must reach 30%. With rft on every teacher (run 17, H200)
    the held-out trained-op tasks failed by template errors at the new shape, while the mixed groups
    of PPO's steps differed only by sampling slips (garbled identifiers, a misnamed file) that greedy
    decoding never makes: PPO could not reach what the held-out rows fail on. At a shape rft did not
    show, the policy's own errors are those of a new shape: with this split (run 18, H200) PPO fixed
    held-out kernels that failed at the new shape (row add and sub launching more than 1,024 threads
    per block, a mean reduction that did not compile) and broke as many others in its 3 steps."""
    base = smoke()
    return msgspec.structs.replace(base, recipe="learning", run_dir="runs/learning",
                                   data=msgspec.structs.replace(base.data, ppo_shapes=(1,)))


def smoke_cpu() -> TrainConfig:
    """The smoke run on a machine without a GPU: a tiny random model, the bundled demonstrations,
    learner on CPU, the fake kernel environment."""
    cfg = smoke()
    return msgspec.structs.replace(
        cfg,
        recipe="smoke_cpu",
        env="fake",
        layout=LayoutConfig(cpu=True, learner_gpus=(0,), verify_gpus=()),
        model=ModelConfig(
            hf_config=tiny_qwen2_config(TINY_VOCAB, hidden=128, layers=2, heads=4, kv_heads=2,
                                        intermediate=256, max_position=16384),
            gradient_checkpointing=False,
            attn_implementation="sdpa",  # no FlexAttention compile for a model this small
        ),
        optim=OptimConfig(actor_lr=1e-4, critic_lr=1e-4, sft_lr=2e-3),
        steps=StepsConfig(rft=4, value=1, ppo=2),
        data=DataConfig(tasks="demos", demos=2, tasks_per_step=2, samples_per_task=1),
        rollout=RolloutConfig(max_turns=3, max_new_tokens=64, max_context_tokens=12288, tool_timeout_s=600.0, seed=0),
        orchestrator=OrchestratorConfig(workers=16, model_slots=16, compile_slots=4, gpu_slots=1),
        engine=EngineSection(embedded=EmbeddedEngineConfig(max_batch_size=16)),
        ppo=PPOConfig(token_budget=8192),
    )


def single_gpu() -> TrainConfig:
    return TrainConfig(
        recipe="single_gpu",
        run_dir="runs/single_gpu",
        stage="ppo",
        # One rank: nothing to shard, so keeping the bf16 weights between forward and backward
        # costs ~1 GB at 0.5B and saves casting them again (1.5B on an H200: +0.9 points of MFU).
        model=ModelConfig(hf_config=qwen2_config("0.5b"), gradient_checkpointing=True, reshard_after_forward=False),
        ppo=PPOConfig(token_budget=16384),
        data=DataConfig(tasks_per_step=16, samples_per_task=4),
        rollout=RolloutConfig(max_turns=40, max_new_tokens=4096, max_context_tokens=32768),
        orchestrator=OrchestratorConfig(workers=64, model_slots=64, compile_slots=8, gpu_slots=1),
        checkpoint=CheckpointConfig(background=True),
    )


def node_8gpu() -> TrainConfig:
    return TrainConfig(
        recipe="node_8gpu",
        run_dir="runs/node_8gpu",
        stage="ppo",
        # 1.5B at 32k tokens per micro-batch, one H200: AC on every block 31.0% MFU, every other
        # block 33.6% (bench.system.learner, compiled blocks). AC on every block all the same: a
        # trajectory may reach max_context_tokens (128k) and then trains in a micro-batch of its
        # own, where a block's saved activations are ~11 GB (14 unsaved blocks would not fit).
        model=ModelConfig(hf_config=qwen2_config("1.5b"), gradient_checkpointing=True, checkpoint_every=1,
                          compile_blocks=True),
        ppo=PPOConfig(token_budget=32768),
        optim=OptimConfig(),
        steps=StepsConfig(ppo=150),
        data=DataConfig(tasks_per_step=128, samples_per_task=8),  # global batch 1024 (the paper)
        layout=LayoutConfig(learner_gpus=(0, 1, 2, 3, 4, 5), verify_gpus=(6, 7)),
        rollout=RolloutConfig(max_turns=150, max_new_tokens=8192, max_context_tokens=131072),
        orchestrator=OrchestratorConfig(workers=512, model_slots=384, compile_slots=32, gpu_slots=2),
        engine=EngineSection(embedded=EmbeddedEngineConfig(max_batch_size=64)),
        checkpoint=CheckpointConfig(background=True),
    )


def _scaled(name: str, learner_gpus: tuple[int, ...], verify_gpus: tuple[int, ...], size: str) -> TrainConfig:
    """node_8gpu with fewer GPUs: same roles (colocated learner + engines, exclusive
    verification), the per-step batch and the concurrency scaled by the learner GPU count."""
    base, share = node_8gpu(), len(learner_gpus) / 6
    return msgspec.structs.replace(
        base,
        recipe=name,
        run_dir=f"runs/{name}",
        model=msgspec.structs.replace(base.model, hf_config=qwen2_config(size)),
        data=msgspec.structs.replace(base.data, tasks_per_step=max(8, round(128 * share))),
        layout=LayoutConfig(learner_gpus=learner_gpus, verify_gpus=verify_gpus),
        orchestrator=OrchestratorConfig(
            workers=max(64, round(512 * share)), model_slots=max(64, round(384 * share)),
            compile_slots=16, gpu_slots=len(verify_gpus),
        ),
    )


def node_4gpu() -> TrainConfig:
    return _scaled("node_4gpu", (0, 1, 2), (3,), "1.5b")


def node_2gpu() -> TrainConfig:
    return _scaled("node_2gpu", (0,), (1,), "0.5b")


RECIPES: dict[str, Callable[[], TrainConfig]] = {
    "smoke": smoke,
    "learning": learning,
    "smoke_cpu": smoke_cpu,
    "single_gpu": single_gpu,
    "node_8gpu": node_8gpu,
    "node_4gpu": node_4gpu,
    "node_2gpu": node_2gpu,
}
