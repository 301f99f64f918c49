"""The whole configuration of a training run, as one typed tree of frozen Structs.

What it is: `TrainConfig` and its sections, dotted overrides from the command line
(`ppo.clip_high=0.3`, `layout.learner_gpus=[0,1]`), and saving the resolved config with the run.
What it is not: the named runs themselves (`rl/recipes.py` returns whole configs) or the
component configs that live next to their owners (`ModelConfig` in `rl/learner/models.py`, `PPOConfig`
in `rl/learner/update.py`, `EmbeddedEngineConfig` in `rl/engine/embedded.py`, ...).

Example:
    cfg = apply_overrides(recipes.smoke(), ["steps.ppo=4", "ppo.clip_high=0.3"])
    save_config(cfg, run_dir)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import orjson
from msgspec import Struct

from agentcore.orchestrator import OrchestratorConfig
from agentcore.rollout import RolloutConfig
from agentcore.sandbox import SandboxConfig
from agentcore.sglang import SGLangLaunch
from rewards.env import EnvConfig
from rl.engine.embedded import EmbeddedEngineConfig
from rl.learner.models import ModelConfig
from rl.learner.update import PPOConfig
from rl.weight_sync import WeightSyncConfig

Stage = Literal["single_turn", "rft", "value", "ppo", "smoke"]


class OptimConfig(Struct, frozen=True, kw_only=True):
    """AdamW for actor and critic (the paper: actor 3e-6, critic 6e-6)."""

    actor_lr: float = 3e-6
    """Actor learning rate."""
    critic_lr: float = 6e-6
    """Critic learning rate."""
    sft_lr: float = 1e-5
    """Learning rate of rejection fine-tuning (actor)."""
    sft_lr_schedule: Literal["constant", "linear"] = "constant"
    """linear: sft_lr falls linearly over the rft stage, to sft_lr / steps at its last step. A long
    rft at a high rate can otherwise end in an Adam spike once the loss nears 0 (the CPU smoke at
    2e-3: loss 1.6e-5 at step 173, 1.14 at step 198)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up, in optimizer steps."""
    fused: bool = True
    """AdamW(fused=True) on CUDA: one kernel per step instead of foreach launches (1.5B, 16k tokens,
    no AC, H200: 37.8 -> 38.9% MFU in `python -m bench.system.learner --fused-adam`). CPU: foreach."""


class LayoutConfig(Struct, frozen=True, kw_only=True):
    """Which GPUs do what. On an 8-GPU node: the learner ranks and their colocated engines on
    six GPUs, verification and profiling exclusive on two. On one GPU everything shares it, and
    timing is less stable (documented in the README)."""

    learner_gpus: tuple[int, ...] = (0,)
    """GPUs of the FSDP2 learner ranks; each also hosts an embedded engine replica."""
    verify_gpus: tuple[int, ...] = (0,)
    """GPUs of the verification/profiling queue."""
    cpu: bool = False
    """Run the learner on CPU (gloo) - tests and the CPU smoke variant."""
    port_base: int = 0
    """First HTTP port of the learner ranks (rank r listens on port_base + r); 0 = pick free."""
    learner_memory_share: Annotated[float, msgspec.Meta(gt=0, le=1)] = 1.0
    """The share of its GPU's memory each learner rank may hold (its engine's included). Below 1 when
    runs share a GPU: at its share, a rank's caching allocator gives back what it caches before it
    asks for more, instead of keeping memory the other runs need."""


class EngineSection(Struct, frozen=True, kw_only=True):
    """Where rollouts are generated: the embedded engine in each learner rank, or SGLang."""

    kind: Literal["embedded", "sglang"] = "embedded"
    """`embedded` (default, no server needed) or `sglang` (`urls`, or servers the run starts)."""
    urls: tuple[str, ...] = ()
    """SGLang server URLs when kind is sglang; none: the run starts one per learner GPU (`sglang`)."""
    sglang: SGLangLaunch = SGLangLaunch()
    """The servers the run starts when kind is sglang and `urls` is empty."""
    embedded: EmbeddedEngineConfig = EmbeddedEngineConfig()
    """The embedded engine of each rank."""
    family: str = "hermes"
    """Tool-call format of the chat template."""
    release_during_training: bool = True
    """Engines colocated with the learner (embedded, or SGLang under weight_sync.mode=sglang_tensor)
    free their GPU memory for each update and get it back with the new weights; only when strictly
    on-policy (max_staleness=0: otherwise the next step's rollouts are generating meanwhile)."""


class DataConfig(Struct, frozen=True, kw_only=True):
    """Where tasks come from and how a step draws them."""

    tasks: str = "demos"
    """`demos` (the bundled demonstration tasks), `families` (the training split of
    `rl.data.families`, whose teacher solutions are the rft demonstrations), or a task file /
    directory for agentcore.tasks."""
    family_scale: float = 1.0
    """Size of the `families` tasks: 1 = shapes sized to `family_target_ms`; other values give
    toy shapes (CPU runs with the fake environment)."""
    family_target_ms: float = 3.0
    """Eager time (H100 roofline estimate) a `families` task is sized to at scale 1."""
    heldout: bool = False
    """Evaluate the `families` held-out split (tasks never trained on) before the first stage
    and after the rft and ppo stages: `heldout.jsonl` in the run directory."""
    heldout_samples: int = 1
    """Trajectories per held-out task in one evaluation."""
    heldout_temperature: float = 0.0
    """Sampling temperature of the held-out evaluation (0: greedy)."""
    tokenizer: str = ""
    """Tokenizer directory; empty = the model's directory, or the built-in tiny tokenizer."""
    tasks_per_step: int = 8
    """Distinct tasks per PPO step."""
    samples_per_task: int = 4
    """Trajectories per task per step."""
    demos: int = 4
    """Demonstration tasks driven through the real tools for rejection fine-tuning (smoke)."""
    demo_names: tuple[str, ...] = ()
    """Which bundled demonstrations (directory names in rl/demos); empty = the first `demos`."""
    with_demo_tasks: bool = False
    """Also train on the demonstration tasks (`demos`, `demo_names`) next to a task file's: after
    rft on their demonstrations a random-weight model's rollouts write real kernels for them."""
    collect_tasks: int = 0
    """Tasks rolled out by one rft/value collection (the first of the step-0 order); 0: all."""
    time_demos: bool = False
    """Time the rft collection's teacher trajectories: their script calls profile and the final
    evaluation times them. Off: the script goes read, write, compile, verify, finish and a verified
    teacher scores milestone 1 untimed (rft keeps reward > 0 alone; timing jobs have the GPU alone,
    and a task's first profile also times both baselines: 66 teachers' profile turns held an H200's
    collection to ~11 min)."""
    rft_policy_rollouts: bool = True
    """The rft collection also rolls out the policy on a task file's tasks (keeping reward > 0);
    off: demonstrations only (a random-weight model's rollouts of thousands of tokens are never
    kept, and they are the slow part of the collection)."""
    ppo_shapes: tuple[Annotated[int, msgspec.Meta(ge=0, le=2)], ...] = ()
    """`families` only: the shapes (s0-s2) whose training tasks are PPO's, and which rft does not
    teach. PPO then practises trained ops at a shape imitation never showed it, as the held-out
    split's new shapes ask: after rft on every teacher, the held-out failures of trained ops were
    template errors at the new shape, while PPO's groups on taught tasks differed only by slips of
    sampling. Empty: rft teaches every training task and PPO draws from all of them."""
    dynamic_tasks: Annotated[int, msgspec.Meta(ge=0)] = 0
    """Dynamic sampling (`rl.dynamic_sampling`): a PPO step whose groups are not `tasks_per_step`
    mixed ones (rewards that differ) draws up to this many more tasks of PPO's pool, and learns from
    the mixed groups alone. 0: off, every usable sample is learnt from."""
    seed: int = 0
    """Seed of the task order (the data position is the step)."""


class StepsConfig(Struct, frozen=True, kw_only=True):
    """How many updates each stage runs."""

    single_turn: int = 20
    """Single-turn warm-up PPO steps."""
    rft: int = 20
    """Rejection fine-tuning optimizer steps."""
    rft_epochs: int = 2
    """Passes over the kept trajectories per RFT step budget."""
    value: int = 10
    """Value pretraining steps."""
    ppo: int = 150
    """Agentic PPO steps (the paper: 150)."""


class CheckpointConfig(Struct, frozen=True, kw_only=True):
    every_steps: int = 10
    """Save every N steps (and at the end of a stage)."""
    keep: int = 3
    """Checkpoints kept."""
    export_hf: bool = True
    """Also export the actor as a Hugging Face directory at each checkpoint."""
    background: bool = False
    """Write checkpoints behind training: a save stages the state in host memory (about this
    rank's checkpoint shard) and returns; write, fsync, commit and HF export run in a thread.
    On in the GPU recipes: a 0.5B actor + critic + AdamW checkpoint on an H100 host blocked
    training 20.0 s, in the background 5.0 s (bench.system.checkpoint)."""


class TrainConfig(Struct, frozen=True, kw_only=True):
    """Everything `cuda-agent train` runs with; saved as RUN/config.json."""

    recipe: str = "custom"
    """Name of the recipe this came from."""
    run_dir: str = "runs/train"
    """Where checkpoints, trajectories and metrics go."""
    stage: Stage = "ppo"
    """What to run (`smoke` chains rft -> value -> ppo on demonstrations)."""
    init_from: str = ""
    """Run directory (or HF directory) whose latest actor/critic start this stage, or one
    checkpoint directory of a run (RUN/ckpt/step_N)."""
    model: ModelConfig = ModelConfig()
    ppo: PPOConfig = PPOConfig()
    optim: OptimConfig = OptimConfig()
    steps: StepsConfig = StepsConfig()
    data: DataConfig = DataConfig()
    layout: LayoutConfig = LayoutConfig()
    engine: EngineSection = EngineSection()
    rollout: RolloutConfig = RolloutConfig()
    orchestrator: OrchestratorConfig = OrchestratorConfig()
    sandbox: SandboxConfig = SandboxConfig()
    env: Literal["fake", "real"] = "real"
    """Kernel environment: `real` (compile pool + GPU queue) or `fake` (CPU tests)."""
    kernel_env: EnvConfig = EnvConfig()
    weight_sync: WeightSyncConfig = WeightSyncConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    max_staleness: int = 0
    """0 = strictly on-policy; k > 0 lets rollouts of step s+1 overlap training of step s and
    accepts trajectories sampled up to k weight versions behind."""
    seed: int = 0


S = TypeVar("S", bound=Struct)


def apply_overrides(cfg: S, overrides: list[str]) -> S:
    """Apply `a.b.c=value` overrides to a config Struct (a TrainConfig, or any other); the value
    is parsed as JSON when it can be, else a string. Unknown keys and ill-typed values raise
    ValueError naming the key."""
    tree = msgspec.to_builtins(cfg)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r} is not key=value")
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                raise ValueError(f"override {key!r}: {part!r} is not a config section")
            node = node[part]
        if leaf not in node:
            raise ValueError(f"override {key!r}: unknown key {leaf!r} (have: {', '.join(sorted(node))})")
        node[leaf] = _parse_value(raw)
    try:
        return msgspec.convert(tree, type(cfg))
    except msgspec.ValidationError as exc:
        raise ValueError(f"bad override: {exc}") from None


def _parse_value(raw: str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw


def save_config(cfg: TrainConfig, run_dir: Path) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_bytes(orjson.dumps(msgspec.to_builtins(cfg), option=orjson.OPT_INDENT_2))
    tmp.replace(path)
    return path


def load_config(run_dir: Path) -> TrainConfig:
    return msgspec.convert(orjson.loads((run_dir / "config.json").read_bytes()), TrainConfig)
