"""rl.data.filters through a real GpuQueue: on CPU its lane is a worker process whose handler runs
with device cpu and a host timer (a wide runtime window set here); the GPU test uses CUDA."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from agentcore.types import Task
from rewards.queue.gpu_queue import GpuQueue, GpuQueueConfig
from rewards.queue.jobs import JobStatus
from rl.data.filters import (
    HANDLER,
    KIND,
    REASONS,
    STAGES,
    FilterConfig,
    filter_on_queue,
    result_from_job,
)

TEMPLATE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, x):
{forward}


def get_inputs():
    return [torch.rand({shape})]


def get_init_inputs():
    return []
"""


def source(forward: str, init: str = "        pass", shape: str = "16, 64") -> str:
    return TEMPLATE.format(init=init, forward=forward, shape=shape)


TASKS = {
    "good": source("        return torch.tanh(self.fc(x))", "        self.fc = nn.Linear(64, 64)"),
    "dropout": source("        return self.drop(x) * 3.0", "        self.drop = nn.Dropout(p=0.5)"),
    "rand_in_forward": source("        return x + torch.randn_like(x)"),
    "constant": source("        return torch.softmax(x.sum(dim=1, keepdim=True), dim=1)"),
    "input_independent": source("        return self.bias + 1e-4 * x", "        self.bias = nn.Parameter(torch.randn(64))"),
    "too_fast": source("        return torch.relu(x) - 0.5", shape="4, 8"),
    "raises": source("        return x @ x"),
    "nan": source("        return torch.log(x - 2.0)"),
}

# CPU: a host timer and a window wide enough for the good task; "too_fast" gets a 50 ms floor in
# its own config: a [4, 8] relu takes microseconds, far below it even on a loaded 2-core machine.
WIDE = FilterConfig(device="cpu", min_ms=1e-4, max_ms=1e4, compile_backend="eager")
FLOOR = msgspec.structs.replace(WIDE, min_ms=50.0)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    config = GpuQueueConfig(gpus=(0,), handlers={KIND: HANDLER}, scratch_root=str(tmp_path_factory.mktemp("scratch")),
                            job_default_deadline_s=120.0, worker_start_timeout_s=60.0)

    async def run_all():
        out = {}
        async with GpuQueue(config) as queue:
            for name, text in TASKS.items():
                task = Task(task_id=name, source=text)
                out[name] = await filter_on_queue(queue, task, FLOOR if name == "too_fast" else WIDE)
        return out

    return anyio.run(run_all)


def test_a_good_task_is_accepted_with_measurements(results):
    r = results["good"]
    assert r.ok and r.reason == "" and r.stage == "", r.message
    m = r.measurements
    assert m.device == "cpu" and m.timer == "host"
    assert m.eager_ms > 0 and m.peak_mem_mib > 0 and m.param_count == 64 * 64 + 64
    assert m.output_shape == "16x64" and m.output_std > 0
    assert m.repeat_max_diff == 0.0 and m.min_pair_diff > 1e-2
    assert m.compile_s is not None and m.compile_max_diff <= 1e-5


@pytest.mark.parametrize("name", ["dropout", "rand_in_forward"])
def test_a_stochastic_op_is_rejected(results, name):
    r = results[name]
    assert (r.ok, r.reason, r.stage) == (False, "stochastic", "deterministic")
    assert r.measurements.repeat_max_diff > 0.1


def test_a_constant_output_is_rejected(results):
    assert (results["constant"].ok, results["constant"].reason) == (False, "constant_output")


def test_an_input_independent_output_is_rejected(results):
    r = results["input_independent"]
    assert (r.ok, r.reason) == (False, "input_independent")
    assert r.measurements.output_std > 0.1  # not constant: the parameter varies, the input does not matter
    assert r.measurements.min_pair_diff < 1e-2


def test_a_too_fast_task_is_rejected_with_its_time(results):
    r = results["too_fast"]
    assert (r.ok, r.reason, r.stage) == (False, "too_fast", "runtime")
    assert 0 < r.measurements.eager_ms < 50.0
    assert "< 50 ms" in r.message


def test_a_forward_that_raises_is_an_eager_error(results):
    r = results["raises"]
    assert (r.ok, r.reason) == (False, "eager_error") and "RuntimeError" in r.message


def test_a_nonfinite_output_is_rejected(results):
    assert results["nan"].reason == "nonfinite"


def test_every_reason_maps_to_a_stage():
    assert set(REASONS.values()) <= set(STAGES) | {"job"}


def test_a_killed_job_is_a_rejection_and_a_raising_handler_a_bug():
    assert result_from_job(JobStatus.TIMEOUT, b"", "killed").reason == "timeout"
    assert result_from_job(JobStatus.CRASHED, b"", "segfault").reason == "crashed"
    with pytest.raises(RuntimeError, match="filter job failed"):
        result_from_job(JobStatus.ERROR, b"", "Traceback ...")


# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_seed_tasks_through_the_gpu_queue(tmp_path):
    """A few seed operators at full scale on the GPU: CUDA timing, inductor, peak memory."""
    from rl.data.seeds import seed_ops, seed_task

    names = ["nn.Conv2d", "nn.GELU", "torch.logsumexp", "nn.LayerNorm"]
    tasks = [seed_task(op) for op in seed_ops() if op.name in names]
    config = GpuQueueConfig(gpus=(0,), handlers={KIND: HANDLER}, scratch_root=str(tmp_path), preload=("torch",))
    lock = tmp_path / "gpu0.lock"
    lock.touch()
    filters = FilterConfig(device="cuda", gpu_lock=str(lock))

    async def run_all():
        async with GpuQueue(config) as queue:
            return [await filter_on_queue(queue, t, filters) for t in tasks]

    results = anyio.run(run_all)
    for task, r in zip(tasks, results):
        print(task.task_id, r.ok, r.reason, r.message, r.measurements)
        m = r.measurements
        assert m.device == "cuda" and m.peak_mem_mib > 100
        assert r.reason not in ("load_error", "eager_error", "compile_error", "crashed", "timeout"), r.message
        if m.eager_ms is not None:
            assert m.timer.startswith("cuda_event") or m.timer in ("torch_event", "first_call")
    conv = results[[t.name for t in tasks].index("nn.Conv2d")]
    assert conv.ok and 1.0 <= conv.measurements.eager_ms <= 100.0 and conv.measurements.compile_s > 0, (
        conv.reason, conv.message, conv.measurements)
