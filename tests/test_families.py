"""The task families: enough distinct tasks, teachers the static checks accept, teacher expressions
that match torch (compiled for the host with g++), every kernel template through nvcc, scripted
trajectories that write the teacher files, and a held-out split disjoint from training.

Building a whole teacher with the real compile pool needs a CUDA build of torch (its bindings
include c10/cuda) and skips on a CPU-only torch; running the teachers through `verify` needs a GPU
and is not tested here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import anyio
import orjson
import pytest
import torch

from agentcore.chat import ChatRenderer
from agentcore.tiny_tokenizer import load_tokenizer
from agentcore.toolparse import tool_schemas
from agentcore.types import Compile, Finish, Profile, Verify, WriteFile
from rewards.env import pristine_files, static_verdict
from rewards.static.checks import check_workspace
from rl.data import families as fam
from rl.demonstrations import demo_engine

SCALE = 0.01
needs_compiler = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("g++") is None, reason="needs nvcc")


@pytest.fixture(scope="module")
def split() -> fam.Split:
    return fam.split(scale=SCALE)


def all_tasks(split):
    return [*split.train, *split.heldout]


def write_workspace(root, task, files):
    for rel, data in pristine_files(task).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def run_model(source: str):
    ns: dict = {}
    exec(compile(source, "model.py", "exec"), ns)  # noqa: S102 - the generator's own source
    inputs = ns["get_inputs"]()
    return inputs, ns["Model"](*ns["get_init_inputs"]())(*inputs)


def test_at_least_sixty_distinct_tasks_with_stable_unique_ids(split):
    tasks = all_tasks(split)
    assert len({t.source for t in tasks}) == len(tasks) >= 60
    assert len({t.task_id for t in tasks}) == len(tasks)
    assert all("/" not in t.task_id for t in tasks)  # demo_engine keys scripts by the session's first segment
    assert [t.task_id for t in fam.split(scale=0.02).train] == [t.task_id for t in split.train]


def test_every_family_is_present_in_training(split):
    assert {t.metadata["family"] for t in split.train} == {"unary", "binary", "chain", "reduce", "norm"}
    chains = [t for t in split.train if t.metadata["family"] == "chain"]
    assert {len(str(t.metadata["ops"]).split(",")) for t in chains} == {2, 3, 4}


def test_every_teacher_passes_the_static_checks(split, tmp_path):
    for i, demo in enumerate(fam.family_demos(all_tasks(split))):
        ws = write_workspace(tmp_path / str(i), demo.task, demo.files)
        assert static_verdict(ws, demo.task) is None, demo.task.task_id
        assert check_workspace(ws, reference=demo.task.source) == [], demo.task.task_id


def test_every_reference_runs_on_the_cpu_at_a_small_scale(split):
    for t in all_tasks(split):
        inputs, out = run_model(t.source)
        rows, cols = t.metadata["rows"], t.metadata["cols"]
        assert inputs[0].shape == (rows, cols)
        assert out.shape == ((rows,) if t.metadata["family"] == "reduce" else (rows, cols)), t.task_id
        assert torch.isfinite(out).all(), t.task_id


def test_real_shapes_aim_at_a_few_milliseconds_within_the_memory_budget():
    s = fam.split()
    for t in all_tasks(s):
        assert 1.0 <= t.metadata["est_eager_ms"] <= 10.0, t.task_id
        assert t.metadata["est_peak_gib"] <= 12.0, t.task_id


def test_no_heldout_task_is_in_training(split):
    train_sources = {t.source for t in split.train}
    train_ops = {op for t in split.train for op in str(t.metadata["ops"]).split(",")}
    train_chains = {t.metadata["ops"] for t in split.train if t.metadata["family"] == "chain"}
    for t in split.heldout:
        assert t.source not in train_sources, t.task_id
        kind = fam.heldout_kind(t)
        ops = set(str(t.metadata["ops"]).split(","))
        if kind == "op":
            assert ops - train_ops, t.task_id
        elif kind == "chain":
            assert ops <= train_ops and t.metadata["ops"] not in train_chains, t.task_id
        else:
            assert t.metadata["shape"] not in {u.metadata["shape"] for u in split.train}, t.task_id


def test_at_least_fifteen_heldout_tasks_and_a_third_with_an_unseen_op(split):
    kinds = [fam.heldout_kind(t) for t in split.heldout]
    assert len(kinds) >= 15
    assert 3 * kinds.count("op") >= len(kinds)
    assert {"op", "chain", "shape"} <= set(kinds)


def test_the_manifest_records_the_version_and_the_split(split):
    m = fam.manifest(split)
    assert m["version"] == fam.VERSION
    assert [r["task_id"] for r in m["heldout"]] == [t.task_id for t in split.heldout]
    assert fam.manifest(fam.split(scale=SCALE)) == m


def test_the_manifest_is_written_into_the_run_directory(split, tmp_path):
    path = fam.write_manifest(tmp_path, split)
    assert orjson.loads(path.read_bytes()) == fam.manifest(split)


def _host_program(ops: dict[str, fam.Op], binary: bool) -> str:
    """A C++ program printing each op's CUDA expression at the grid points it reads on stdin."""
    funcs = "".join(
        f"static float f_{name}(float v, float w) {{ (void)w; return {op.cuda}; }}\n" for name, op in ops.items())
    table = ", ".join(f"f_{name}" for name in ops)
    read_w = "std::scanf(\"%f\", &w);" if binary else ""
    return ("#include <cmath>\n#include <cstdio>\n" + funcs +
            f"int main() {{ float (*fs[])(float, float) = {{{table}}}; int n; std::scanf(\"%d\", &n);\n"
            f"  for (int i = 0; i < n; ++i) {{ float v, w = 0.0f; std::scanf(\"%f\", &v); {read_w}\n"
            "    for (auto f : fs) std::printf(\"%.9g \", f(v, w)); std::printf(\"\\n\"); } }\n")


@pytest.mark.parametrize("binary", [False, True])
@needs_compiler
def test_teacher_expressions_match_torch_on_the_host(tmp_path, binary):
    ops = fam.BINARY if binary else fam.UNARY
    src = tmp_path / "ops.cpp"
    src.write_text(_host_program(ops, binary).replace("fmaxf", "std::fmax").replace("fminf", "std::fmin"))
    subprocess.run(["g++", "-O1", "-o", str(tmp_path / "ops"), str(src)], check=True)
    x = torch.linspace(-25, 25, 1001)
    b = torch.linspace(3, -3, 1001)
    text = f"{len(x)}\n" + "\n".join(f"{v:.9g} {w:.9g}" if binary else f"{v:.9g}" for v, w in zip(x.tolist(), b.tolist()))
    out = subprocess.run([str(tmp_path / "ops")], input=text, capture_output=True, text=True, check=True).stdout
    got = torch.tensor([[float(c) for c in line.split()] for line in out.splitlines()])
    for j, op in enumerate(ops.values()):
        want = eval(op.torch, {"torch": torch, "x": x, "b": b})  # the generator's own expression
        torch.testing.assert_close(got[:, j], want, rtol=1e-4, atol=1e-5, msg=op.name)


def test_a_scripted_trajectory_writes_the_teacher_files_then_compiles_and_verifies(split, tiny_tokenizer_dir):
    renderer = ChatRenderer(load_tokenizer(tiny_tokenizer_dir), tool_schemas(), "hermes")
    demos = fam.family_demos([split.train[0], split.heldout[-1]])
    engine = demo_engine(renderer, demos)
    for demo in demos:
        turns = [renderer.parser.parse(engine.script(f"{demo.task.task_id}/0", i)) for i in range(6)]
        writes = {c.path: c.content for c in turns[1].calls if isinstance(c, WriteFile)}
        assert writes == demo.files
        assert isinstance(turns[2].calls[0], Compile) and isinstance(turns[3].calls[0], Verify)


@pytest.mark.parametrize("timed", [False, True])
async def test_untimed_teachers_finish_after_verify_and_never_call_profile(split, tiny_tokenizer_dir, timed):
    """The rft collection plays the teachers with a profile turn only under `data.time_demos`: a
    profile job has the GPU alone and times both baselines of a task the first time."""
    from rl.config import apply_overrides
    from rl.recipes import smoke_cpu
    from rl.stages import collect_trajectories

    renderer = ChatRenderer(load_tokenizer(tiny_tokenizer_dir), tool_schemas(), "hermes")
    cfg = apply_overrides(smoke_cpu(), ["data.tasks=families", "data.family_scale=0.01", "data.demos=2",
                                        "data.rft_policy_rollouts=false", f"data.time_demos={str(timed).lower()}"])
    engines = []

    class Recording:  # what the collection hands the orchestrator
        def __init__(self):
            self.cfg, self.renderer, self.scorer = cfg, renderer, None

        def untimed_scorer(self):
            return None

        async def rollouts(self, items, *, tag, engine=None, **_):
            engines.append((tag, [i.task.task_id for i in items], engine))
            return []

    await collect_trajectories(Recording(), [], "rft")
    [(tag, ids, engine)] = engines
    assert tag == "rft_demos" and len(ids) == 2
    turns = [renderer.parser.parse(engine.script(f"{ids[0]}/0", i)) for i in range(6)]
    calls = [type(t.calls[0]) for t in turns]
    assert calls[2:4] == [Compile, Verify]
    assert (Profile in calls) is timed
    assert calls[5 if timed else 4] is Finish


def torch_has_cuda_headers() -> bool:
    return (Path(torch.__file__).parent / "include" / "c10/cuda/impl/cuda_cmake_macros.h").exists()


@needs_compiler
def test_every_teacher_kernel_template_compiles_without_warnings(split, tmp_path):
    """Each distinct kernel shape (row kernels per op, elementwise per family and axis) through nvcc;
    the bindings need a CUDA build of torch (the next test)."""
    from rewards.build.toolchain import discover_toolchain

    toolchain = discover_toolchain()
    seen = {}
    for t in all_tasks(split):
        m = t.metadata
        key = (m["family"], m["ops"] if m["family"] in ("reduce", "norm") else m["axis"])
        seen.setdefault(key, t)
    for i, demo in enumerate(fam.family_demos(list(seen.values()))):
        (cu,) = [text for rel, text in demo.files.items() if rel.endswith(".cu")]
        src = tmp_path / f"{i}.cu"
        src.write_text(cu)
        done = subprocess.run([toolchain.nvcc, f"-arch={toolchain.arch}", "-Werror", "all-warnings", "-c", str(src),
                               "-o", str(tmp_path / f"{i}.o")], check=False, capture_output=True, text=True)
        assert done.returncode == 0, f"{demo.task.task_id}: {done.stderr}"


@needs_compiler
@pytest.mark.skipif(not torch_has_cuda_headers(), reason="the bindings need a CUDA build of torch")
def test_one_teacher_per_family_builds_with_the_real_compile_pool(split, tmp_path):
    from rewards.build.compile_pool import CompileConfig, CompilePool
    from rewards.build.toolchain import discover_toolchain

    pool = CompilePool(CompileConfig(cache_dir=str(tmp_path / "cache"), max_parallel=2), discover_toolchain())
    firsts = {}
    for t in split.train:
        firsts.setdefault(t.metadata["family"], t)

    async def build_all():
        results = {}
        for family, demo in zip(firsts, fam.family_demos(list(firsts.values()))):
            ws = write_workspace(tmp_path / family, demo.task, demo.files)
            results[family] = (await pool.build(ws)).result
        return results

    for family, result in anyio.run(build_all).items():
        assert result.ok, f"{family}: {result.log}"

    # a second teacher of a family reuses the first's binding object: only its kernel compiles
    second = next(t for t in split.train if t.metadata["family"] == "unary" and t is not firsts["unary"])
    demo = fam.family_demos([second])[0]
    build = anyio.run(pool.build, write_workspace(tmp_path / "second", demo.task, demo.files))
    assert build.result.ok and set(build.unit_seconds) == {"kernels/unary.cu"}, build.unit_seconds


def test_a_familys_teachers_share_one_binding_file():
    """The binding never names the op, so the compile pool builds it once per family (and axis)."""
    bindings: dict[tuple[str, str], set[str]] = {}
    for spec in (s for group in fam.specs() for s in group):
        text = fam.teacher_files(spec)[f"kernels/{spec.family}_binding.cpp"]
        bindings.setdefault((spec.family, spec.axis), set()).add(text)
    assert len(bindings) == 6 and all(len(texts) == 1 for texts in bindings.values()), bindings.keys()


def test_every_binding_calls_a_launcher_its_kernel_defines(split):
    """The binding and the kernel meet at link time: every extern "C" launcher a binding declares
    is defined by the .cu file of the same teacher with the same parameters, and model_new.py
    calls what the binding registers (`bench.system.rft_probe.links`; a CPU-only torch cannot link
    them here)."""
    from bench.system.rft_probe import links

    by_id = {s.task_id: s for group in fam.specs() for s in group}
    for t in (*split.train, *split.heldout):
        spec = by_id[t.task_id]
        assert links(fam.teacher_files(spec), spec.family) == "", t.task_id