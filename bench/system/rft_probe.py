"""Does rejection fine-tuning on family teachers make greedy decoding write held-out kernels? A probe
of the rft stage that needs no GPU tools.

What it is: the teachers of `rl.data.families` training tasks, drawn as `rl.stages.demonstrations`
draws the rft demonstrations, driven by the scripted demonstration policy through the real
read/write tools (compile, verify and profile answered by `FakeKernelEnv`: tool output is context,
never an action), so the tokens up to the end of the write turn are those of the rft collection; the
project's `sft_step` on them, batched like the rft stage (`Collection.batch`); then, for each
held-out task, the policy's greedy write turn after the prompt, its read turn and the read_file
result, judged on the host:
  builds - nvcc compiles the .cu, the binding declares only launchers the .cu defines with the same
           parameters, and model_new.py calls a function the binding registers;
  right  - elementwise families: the written `apply` compiled with g++ matches the task's own
           `Model` in torch on a grid of inputs; row kernels (reduce, norm), which the host cannot
           run: the .cu equals the teacher's up to comments and whitespace.
Greedy decoding is exact and cheap: one forward pass over the teacher's write turn finds the first
token where the policy's argmax leaves it, and only the rest is generated (bf16).
What it is not: the rollout engine or `verify` (no kernel runs anywhere); a CPU has time for a few
dozen samples of ~1,600 tokens (bf16 autocast: ~10 s each on 2 idle cores, ~40 s on busy ones), a GPU
for the real recipes (minutes per configuration).

    python -m bench.system.rft_probe --teachers 16 --steps 40 --lr 2e-5       # the smoke's rft
    python -m bench.system.rft_probe --teachers 66 --steps 60 --lr 1e-4 --schedule linear
"""

from __future__ import annotations

import argparse
import copy
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import anyio
import msgspec
import orjson
import torch
from msgspec import Struct

from agentcore.chat import ChatRenderer
from agentcore.kernel_env import FakeKernelEnv
from agentcore.rollout import RolloutConfig, RolloutIds, RolloutRunner
from agentcore.sandbox import Sandbox
from agentcore.session import WorkspaceTools
from agentcore.tiny_tokenizer import load_tokenizer
from agentcore.toolparse import tool_schemas
from agentcore.types import Task, Trajectory, WriteFile
from rl.config import apply_overrides
from rl.data import families as fam
from rl.demonstrations import DemoTask, demo_engine
from rl.engine.runner import decoding_attention
from rl.learner.models import ModelConfig, build_actor, place_model
from rl.learner.update import PPOConfig, sft_step
from rl.pretrained import resolve_model
from rl.recipes import smoke
from rl.samples import Sample, sample_from_trajectory
from rl.stages import Collection, demonstrations, sft_lr_scale

ELEMENTWISE = ("unary", "chain", "binary")


class Verdict(Struct, frozen=True, kw_only=True):
    """One held-out task's greedy write turn, judged on the host."""

    task_id: str
    kind: str
    """Why the task is held out: "op", "chain" or "shape" (`families.heldout_kind`)."""
    builds: bool
    right: bool
    diverged_at: int | None
    """First token of the write turn where greedy decoding leaves the teacher's; None: identical."""
    why: str = ""


# ---------------------------------------------------------------------------------------------
# Teacher trajectories.


def teacher_trajectories(demos: list[DemoTask], renderer: ChatRenderer) -> list[Trajectory]:
    """The scripted trajectory of each demo as the smoke's rft collection plays it (read, write,
    compile, verify, finish: the smoke's teachers are untimed)."""
    async def run_all() -> list[Trajectory]:
        root = Path(tempfile.mkdtemp(prefix="rft-probe-ws-"))
        root.chmod(0o711)  # the sandbox's unprivileged uid traverses it
        tools = WorkspaceTools(root=root, sandbox=Sandbox(), kernel_env=FakeKernelEnv())
        script = RolloutConfig(max_turns=12, max_new_tokens=16384, max_context_tokens=16384)
        engine = demo_engine(renderer, demos, profile=False)
        runner = RolloutRunner(engine=engine, renderer=renderer, parser=renderer.parser, config=script)
        out = []
        try:
            for d in demos:
                tid = f"{d.task.task_id}/0/probe"
                async with tools.open(d.task, tid) as box:
                    ids = RolloutIds(trajectory_id=tid, group_id=d.task.task_id, sample_index=0)
                    out.append(await runner.run(d.task, box, ids))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return out

    return anyio.run(run_all)


def write_turn_sample(traj: Trajectory) -> Sample:
    """The trajectory's sample cut after its write turn (the turns after it are the same for
    every task: compile, verify, profile, finish)."""
    end = traj.turns[1].gen_end
    cut = msgspec.structs.replace(traj, response_ids=traj.response_ids[:end], logprobs=traj.logprobs[:end],
                                  loss_mask=traj.loss_mask[:end], reward=1.0)
    return sample_from_trajectory(cut)


# ---------------------------------------------------------------------------------------------
# Judging written files on the host.


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    return " ".join(re.sub(r"//[^\n]*", " ", text).split())


def _params(text: str) -> list[str]:
    return [" ".join(p.split()) for p in text.split(",") if p.strip()]


def links(files: dict[str, str], family: str) -> str:
    """"" when the binding's launchers are defined by the .cu with the same parameters and
    model_new.py calls a function the binding registers; else what is wrong."""
    cu = files.get(f"kernels/{family}.cu", "")
    binding = files.get(f"kernels/{family}_binding.cpp", "")
    declared = dict(re.findall(r'extern "C" \w+ (\w+)\(([^)]*)\)\s*;', binding))
    defined = dict(re.findall(r'extern "C" \w+ (\w+)\(([^)]*)\)\s*\{', cu))
    if not declared:
        return "the binding declares no launcher"
    for name, params in declared.items():
        if name not in defined:
            return f"launcher {name} is not defined in the .cu"
        if _params(params) != _params(defined[name]):
            return f"launcher {name}: binding ({_params(params)}) vs .cu ({_params(defined[name])})"
    registered = set(re.findall(r'm\.def\("(\w+)"', binding))
    called = set(re.findall(r"cuda_extension\.(\w+)\(", files.get("model_new.py", "")))
    if not called or not called <= registered:
        return f"model_new.py calls {sorted(called)}, the binding registers {sorted(registered)}"
    return ""


def nvcc_compiles(cu: str, work: Path) -> str:
    """"" when nvcc compiles the .cu (device and host code, no link); else its first errors."""
    from rewards.build.toolchain import discover_toolchain

    toolchain = discover_toolchain()
    src = work / "k.cu"
    src.write_text(cu)
    done = subprocess.run([toolchain.nvcc, f"-arch={toolchain.arch}", "-c", str(src), "-o", str(work / "k.o")],
                          capture_output=True, text=True, check=False)
    return "" if done.returncode == 0 else "nvcc: " + " ".join(done.stderr.split())[:300]


def _apply_function(cu: str) -> str | None:
    """The `apply` device function of an elementwise kernel, as host C++."""
    m = re.search(r"__device__[\w\s]*float\s+apply\s*\([^)]*\)\s*\{", cu)
    if m is None:
        return None
    depth, i = 0, m.end() - 1
    for i in range(m.end() - 1, len(cu)):
        depth += {"{": 1, "}": -1}.get(cu[i], 0)
        if depth == 0:
            break
    return "static " + re.sub(r"__device__|__forceinline__", "", cu[m.start():i + 1])


def _reference(task: Task, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ns: dict = {}
    exec(compile(task.source, "model.py", "exec"), ns)  # noqa: S102 - the generator's own source
    model = ns["Model"]()
    return model(x, b) if task.metadata["family"] == "binary" else model(x)


def expression_matches(task: Task, cu: str, work: Path) -> str:
    """"" when the .cu's `apply` computes the task's Model elementwise on the host; else why not."""
    fn = _apply_function(cu)
    if fn is None:
        return "no apply function"
    binary = task.metadata["family"] == "binary"
    call = "apply(v, w)" if binary else "apply(v)"
    src = work / "apply.cpp"
    src.write_text("#include <cmath>\n#include <math.h>\n#include <cstdio>\n" + fn +
                   "\nint main() { int n; std::scanf(\"%d\", &n);\n"
                   "  for (int i = 0; i < n; ++i) { float v, w; std::scanf(\"%f %f\", &v, &w);\n"
                   f"    std::printf(\"%.9g\\n\", {call}); }} }}\n")
    built = subprocess.run(["g++", "-O1", "-o", str(work / "apply"), str(src)], capture_output=True, text=True,
                           check=False)
    if built.returncode:
        return "apply does not compile on the host: " + " ".join(built.stderr.split())[:200]
    x, b = torch.linspace(-25, 25, 1001), torch.linspace(3, -3, 1001)
    text = f"{len(x)}\n" + "\n".join(f"{v:.9g} {w:.9g}" for v, w in zip(x.tolist(), b.tolist()))
    out = subprocess.run([str(work / "apply")], input=text, capture_output=True, text=True, check=False, timeout=60)
    try:
        got = torch.tensor([float(s) for s in out.stdout.split()])
        torch.testing.assert_close(got, _reference(task, x, b), rtol=1e-4, atol=1e-5, equal_nan=True)
    except (ValueError, AssertionError, RuntimeError) as exc:
        return "apply differs from the reference: " + " ".join(str(exc).split())[:200]
    return ""


def judge(task: Task, files: dict[str, str], teacher: dict[str, str]) -> tuple[bool, bool, str]:
    """(builds, right, why) of the files a policy wrote for `task`; `teacher` is its teacher's files."""
    family = str(task.metadata["family"])
    cu = files.get(f"kernels/{family}.cu")
    if cu is None:
        return False, False, f"no kernels/{family}.cu written (wrote {sorted(files)})"
    with tempfile.TemporaryDirectory(prefix="rft-probe-") as tmp:
        problem = links(files, family) or nvcc_compiles(cu, Path(tmp))
        if family in ELEMENTWISE:
            wrong = expression_matches(task, cu, Path(tmp))
        else:
            (want,) = [v for k, v in teacher.items() if k.endswith(".cu")]
            wrong = "" if _strip_comments(cu) == _strip_comments(want) else "the row kernel differs from the teacher's"
    return not problem, not wrong, "; ".join(w for w in (problem, wrong) if w)


# ---------------------------------------------------------------------------------------------
# Training and greedy decoding.


def train(actor, samples: list[Sample], *, steps: int, lr: float, batch: int, schedule: str, device: str,
          token_budget: int, seed: int = 0) -> list[float]:
    """`steps` sft steps on `samples` batched like the rft stage; the loss of each step."""
    opt = torch.optim.AdamW(actor.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    collection = Collection(samples, {}, batch, seed=seed)
    losses = []
    for k in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * sft_lr_scale(schedule, k, steps)
        t0 = time.perf_counter()
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            m = sft_step(actor, opt, collection.batch(k), PPOConfig(token_budget=token_budget), device)
        losses.append(m["sft_loss"])
        print(f"  step {k + 1}/{steps}: sft_loss {m['sft_loss']:.4f} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return losses


@torch.no_grad()
def greedy_write_turns(lm, trajs: list[Trajectory], stop_ids: tuple[int, ...], *, slack: int = 256,
                       batch: int = 8) -> list[tuple[list[int], int | None]]:
    """(write-turn ids, first diverging token or None) of greedy decoding from each trajectory's
    context before its write turn: the teacher's tokens up to the first position where the argmax
    differs, then generated."""
    with decoding_attention(next(lm.parameters()).device):  # as the engine decodes
        return _greedy_write_turns(lm, trajs, stop_ids, slack=slack, batch=batch)


def _greedy_write_turns(lm, trajs: list[Trajectory], stop_ids: tuple[int, ...], *, slack: int,
                        batch: int) -> list[tuple[list[int], int | None]]:
    device = next(lm.parameters()).device
    out: list[tuple[list[int], int | None]] = []
    pending = []
    for t in trajs:
        w = t.turns[1]
        ctx, teacher = t.prompt_ids + t.response_ids[:w.gen_start], t.response_ids[w.gen_start:w.gen_end]
        logits = lm(input_ids=torch.tensor([ctx + teacher], device=device)).logits[0, len(ctx) - 1:-1]
        greedy = logits.argmax(-1).tolist()
        m = next((i for i, (g, want) in enumerate(zip(greedy, teacher)) if g != want), None)
        out.append((teacher, None) if m is None else (teacher[:m], m))
        if m is not None:
            pending.append((len(out) - 1, ctx + teacher[:m], len(teacher) - m + slack))
    pad = stop_ids[0]
    for start in range(0, len(pending), batch):
        chunk = pending[start:start + batch]
        width = max(len(ids) for _, ids, _ in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for _, p, _ in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for _, p, _ in chunk], device=device)
        gen = lm.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max(n for *_, n in chunk),
                          eos_token_id=list(stop_ids), pad_token_id=pad)[:, width:].tolist()
        for (i, _, _), new in zip(chunk, gen):
            keep = next((j + 1 for j, tok in enumerate(new) if tok in stop_ids), len(new))
            out[i] = (out[i][0] + new[:keep], out[i][1])
    return out


def written_files(renderer: ChatRenderer, ids: list[int]) -> dict[str, str]:
    calls = renderer.parser.parse(renderer.assistant_text(ids)).calls
    return {c.path: c.content for c in calls if isinstance(c, WriteFile)}


# ---------------------------------------------------------------------------------------------
# The probe.


def probe(*, teachers: int, steps: int, lr: float, batch: int = 16, schedule: str = "constant", seed: int = 0,
          device: str = "cpu", model: str = "smollm2-135m", token_budget: int = 4096,
          target_ms: float = 0.1, tasks: tuple[str, ...] = ()) -> dict:
    """Train on `teachers` teacher trajectories, judge greedy write turns of the held-out tasks
    (those named in `tasks`; all when empty)."""
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    cfg = apply_overrides(smoke(), [f"data.demos={teachers}", f"data.seed={seed}", f"data.family_target_ms={target_ms}"])
    renderer = ChatRenderer(load_tokenizer(str(resolve_model(model))), tool_schemas(), cfg.engine.family)
    demos = sorted(demonstrations(cfg), key=lambda d: d.task.task_id)  # the rft collection's order
    heldout = [d for d in fam.family_demos(fam.split_for(cfg.data).heldout) if not tasks or d.task.task_id in tasks]
    samples = [write_turn_sample(t) for t in teacher_trajectories(demos, renderer)]
    print(f"{len(samples)} teachers, {sum(len(s.token_ids) for s in samples) / len(samples):.0f} tokens each; "
          f"{steps} steps of {min(batch, len(samples))} at lr {lr:g} ({schedule})", flush=True)
    actor = build_actor(ModelConfig(path=model, gradient_checkpointing=False, attn_implementation="sdpa"), device)
    losses = train(actor, samples, steps=steps, lr=lr, batch=batch, schedule=schedule, device=device,
                   token_budget=token_budget, seed=seed)
    trained_s = time.perf_counter() - t0
    # the engine's placement: bf16 weights, fp32 RoPE buffers (bf16 matmuls are fast on CPUs too)
    lm = place_model(copy.deepcopy(actor.lm), torch.device(device), torch.bfloat16).eval()
    del actor
    trajs = teacher_trajectories(heldout, renderer)
    verdicts = []
    for d, t, (ids, diverged) in zip(heldout, trajs, greedy_write_turns(lm, trajs, tuple(renderer.stop_token_ids))):
        builds, right, why = judge(d.task, written_files(renderer, ids), d.files)
        verdicts.append(Verdict(task_id=d.task.task_id, kind=fam.heldout_kind(d.task), builds=builds, right=right,
                                diverged_at=diverged, why=why))
    return {"teachers": len(samples), "steps": steps, "lr": lr, "batch": batch, "schedule": schedule, "seed": seed,
            "losses": losses, "train_s": round(trained_s, 1), "total_s": round(time.perf_counter() - t0, 1),
            "builds": sum(v.builds for v in verdicts), "right": sum(v.right for v in verdicts),
            "passes": sum(v.builds and v.right for v in verdicts), "tasks": len(verdicts),
            "verdicts": [msgspec.to_builtins(v) for v in verdicts]}


def report(result: dict) -> str:
    lines = [f"{'task':<48} {'new':<6} {'builds':<7} {'right':<6} diverged  why"]
    for v in result["verdicts"]:
        at = "-" if v["diverged_at"] is None else str(v["diverged_at"])
        lines.append(f"{v['task_id']:<48} {v['kind']:<6} {'yes' if v['builds'] else 'no':<7} "
                     f"{'yes' if v['right'] else 'no':<6} {at:<9} {v['why'][:120]}")
    n = result["tasks"]
    lines.append(f"teachers {result['teachers']}, {result['steps']} steps at lr {result['lr']:g} "
                 f"(loss {result['losses'][0]:.3f} -> {result['losses'][-1]:.3f}): builds {result['builds']}/{n}, "
                 f"right {result['right']}/{n}, both {result['passes']}/{n}; {result['total_s']:.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.system.rft_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--teachers", type=int, default=16, help="training teachers (66: all of them)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--batch", type=int, default=16, help="samples per step (the rft stage: tasks_per_step x samples)")
    p.add_argument("--schedule", choices=("constant", "linear"), default="constant")
    p.add_argument("--seed", type=int, default=0, help="which teachers are drawn when fewer than all")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--token-budget", type=int, default=0,
                   help="tokens per packed micro-batch (0: the smoke's 16384 on a GPU, one sample at a time on a CPU)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    p.add_argument("--tasks", default="", help="comma-separated held-out task ids to judge (default: all 17)")
    p.add_argument("--out", help="write the result as JSON here")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    budget = a.token_budget or (16384 if a.device.startswith("cuda") else 2048)
    result = probe(teachers=a.teachers, steps=a.steps, lr=a.lr, batch=a.batch, schedule=a.schedule, seed=a.seed,
                   device=a.device, model=a.model, token_budget=budget,
                   tasks=tuple(t for t in a.tasks.split(",") if t))
    print(report(result))
    if a.out:
        Path(a.out).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
