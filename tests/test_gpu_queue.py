"""The GPU job queue on a CPU machine: the lanes of GPUs "0" and "1" are worker processes with
CUDA_VISIBLE_DEVICES set, running the built-in handlers of `rewards.queue.jobs` (and a few written by
the tests into a module on PYTHONPATH; `timed_sleep`, a kind outside `SHARED_KINDS`, stands for a
timing job). The queue, the workers and bubblewrap are real."""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import anyio
import anyio.abc
import msgspec
import pytest

from rewards.queue.gpu_queue import (
    GpuQueue,
    GpuQueueConfig,
    QueueClosed,
    WorkerStartError,
    worker_env,
)
from rewards.queue.jobs import (
    CrashArgs,
    EchoEnvArgs,
    EchoEnvValue,
    Job,
    JobStatus,
    PrintArgs,
    SleepArgs,
    SleepValue,
    decode,
    encode,
)
from rewards.queue.lanes import Dispatcher, Lane
from tests.fakes.tmp_venv import make_venv

_ids = itertools.count()

TEST_HANDLERS = '''
import subprocess

def spawn(payload, ctx):
    """Starts `sleep <payload>` in the background; detached (own session) if asked."""
    seconds, _, mode = payload.decode().partition(" ")
    subprocess.Popen(["sleep", seconds], start_new_session=(mode == "detached"))
    return b"spawned"

def shout(payload, ctx):
    return payload.upper()

def compile_sum(payload, ctx):
    """torch.compile on the CPU (a cold Inductor compile: the cache is in the emptied scratch)."""
    import torch
    import torch._inductor.config as inductor

    scale = float(payload.decode())
    out = torch.compile(lambda x: (x * scale + 1).sum())(torch.arange(8.0))
    return f"{inductor.compile_threads} {float(out)}".encode()

def torch_threads(payload, ctx):
    """torch's CPU threads in the worker, and in a child process it starts."""
    import subprocess
    import sys

    import torch

    child = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    return f"{torch.get_num_threads()} {child}".encode()

def staged_sleep(payload, ctx):
    """Prepares (sleeps `prepare` s), asks for its GPU alone if it may, then "times" (sleeps
    `timed` s), then shares its GPU again and sleeps `tail` s (0 by default):
    'prepared_at alone_at shared_at ended waited asked' (time.time)."""
    import time

    prepare, timed, tail = ([float(x) for x in payload.decode().split()] + [0.0])[:3]
    time.sleep(prepare)
    alone_at = time.time()
    waited = ctx.gpu_alone() if ctx.gpu_alone is not None else 0.0
    alone_at += waited
    time.sleep(timed)
    if tail and ctx.gpu_shared is not None:
        ctx.gpu_shared()
    shared_at = time.time()
    time.sleep(tail)
    return (f"{alone_at - waited - prepare} {alone_at} {shared_at} {time.time()} {waited} "
            f"{ctx.gpu_alone is not None}").encode()

def staged_gated(payload, ctx):
    """Prepares (sleeps `payload` s), asks for its GPU alone: 'timed', or 'withdrawn: <why>'."""
    import time

    from rewards.queue.jobs import GpuWithdrawn

    time.sleep(float(payload.decode()))
    try:
        ctx.gpu_alone()
    except GpuWithdrawn as exc:
        ctx.gpu_shared()  # nothing to give back: a no-op
        return f"withdrawn: {exc}".encode()
    return b"timed"
'''


def job(kind: str, args=None, **fields) -> Job:
    payload = encode(args) if args is not None else b""
    return Job(job_id=f"job-{next(_ids)}", kind=kind, payload=payload, **fields)


@pytest.fixture
def outside_dir():
    """A host dir outside /tmp: the sandbox has a /tmp of its own, so this is what it sees."""
    path = tempfile.mkdtemp(prefix="gpu-queue-test-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def config(tmp_path, outside_dir, monkeypatch) -> GpuQueueConfig:
    (outside_dir / "handlers").mkdir()
    (outside_dir / "handlers" / "queue_test_handlers.py").write_text(TEST_HANDLERS)
    monkeypatch.setenv("PYTHONPATH", str(outside_dir / "handlers"))
    return GpuQueueConfig(
        gpus=(0, 1),
        scratch_root=str(tmp_path / "scratch"),
        gpu_lock_dir=str(tmp_path / "gpu-locks"),  # this test's queues see each other, no one else's
        job_default_deadline_s=30.0,
        worker_start_timeout_s=30.0,
        handlers={"spawn": "queue_test_handlers:spawn", "shout": "queue_test_handlers:shout",
                  "compile_sum": "queue_test_handlers:compile_sum", "torch_threads": "queue_test_handlers:torch_threads",
                  "timed_sleep": "rewards.queue.jobs:sleep",  # not a shared kind: has its GPU alone
                  "staged_sleep": "queue_test_handlers:staged_sleep", "staged_silent": "rewards.queue.jobs:sleep",
                  "staged_gated": "queue_test_handlers:staged_gated"},
        staged_kinds=("staged_sleep", "staged_silent", "staged_gated"),  # prepare beside the shared jobs, then time alone
    )


def one_lane(config: GpuQueueConfig, **changes) -> GpuQueueConfig:
    from msgspec.structs import replace

    return replace(config, gpus=(0,), **changes)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def processes_with_arg(arg: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if arg.encode() in f.read().split(b"\0"):
                    found.append(int(name))
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError, PermissionError):
            pass
    return [pid for pid in found if alive(pid)]


async def eventually(check, timeout_s: float = 5.0):
    """The first truthy value of `check()`, polled; the last falsy one after `timeout_s`."""
    with anyio.move_on_after(timeout_s):
        while not (value := check()):
            await anyio.sleep(0.02)
    return value


def unique_seconds() -> str:
    """A `sleep` argument no other process on the machine has."""
    return f"{900 + os.getpid() % 97}.{next(_ids):06d}{int.from_bytes(os.urandom(4), 'big'):010d}"


# ---------------------------------------------------------------------------------------------
# Jobs and lanes.


async def test_jobs_return_their_handlers_values(config):
    async with GpuQueue(config) as queue:
        result = await queue.submit(job("ping"))
        shouted = await queue.submit(Job(job_id="s", kind="shout", payload=b"hello"))
    assert (result.status, result.value) == (JobStatus.OK, b"pong")
    assert (shouted.status, shouted.value) == (JobStatus.OK, b"HELLO")


async def test_never_more_jobs_at_once_than_lanes(config):
    results = []

    async def run_one():
        results.append(await queue.submit(job("sleep", SleepArgs(seconds=0.05))))

    async with GpuQueue(config) as queue, anyio.create_task_group() as tg:
        for _ in range(12):
            tg.start_soon(run_one)
    spans = [(decode(r.value, SleepValue), r.gpu) for r in results]
    for gpu in (0, 1):
        mine = sorted((v.started, v.ended) for v, g in spans if g == gpu)
        assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(mine))
    events = sorted([(v.started, 1) for v, _ in spans] + [(v.ended, -1) for v, _ in spans])
    running = list(itertools.accumulate(step for _, step in events))
    assert max(running) <= 2


async def test_waiting_jobs_go_to_whichever_lane_is_free(config):
    results = []

    async def run_one():
        results.append(await queue.submit(job("sleep", SleepArgs(seconds=0.05))))

    async with GpuQueue(config) as queue, anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(run_one)
    assert {r.gpu for r in results} == {0, 1}


async def test_pinned_job_runs_on_its_gpu_with_cuda_visible_devices_set(config):
    async with GpuQueue(config) as queue:
        result = await queue.submit(job("echo_env"), gpu=1)
    assert result.gpu == 1
    assert decode(result.value, EchoEnvValue).cuda_visible_devices == "1"


def test_lane_indexes_the_gpus_the_orchestrator_sees(config, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    assert worker_env(config, 1, Path("/tmp"))["CUDA_VISIBLE_DEVICES"] == "7"


async def test_job_files_are_written_into_the_scratch_dir(config):
    scratch = Path(config.scratch_root) / "gpu0"
    probe = EchoEnvArgs(read_paths=(str(scratch / "kernels" / "k.cu"),))
    async with GpuQueue(one_lane(config)) as queue:
        result = await queue.submit(job("echo_env", probe, files={"kernels/k.cu": b"__global__"}))
    assert decode(result.value, EchoEnvValue).read_bytes == {str(scratch / "kernels" / "k.cu"): 10}


# ---------------------------------------------------------------------------------------------
# Several lanes per GPU: verification shares a GPU, timing has it alone.


def shared_gpu(config: GpuQueueConfig, lanes_per_gpu: int = 2, gpus: tuple[int, ...] = (0,)) -> GpuQueueConfig:
    from msgspec.structs import replace

    return replace(config, gpus=gpus, lanes_per_gpu=lanes_per_gpu)


def overlap(a: SleepValue, b: SleepValue) -> bool:
    return a.started < b.ended and b.started < a.ended


class Runs:
    """Submits named jobs in the background and keeps their sleep intervals."""

    def __init__(self, queue: GpuQueue, tg: anyio.abc.TaskGroup) -> None:
        self.queue, self.tg, self.results = queue, tg, {}

    def start(self, name: str, kind: str, seconds: float, **submit) -> None:
        async def run():
            self.results[name] = await self.queue.submit(job(kind, SleepArgs(seconds=seconds)), **submit)

        self.tg.start_soon(run)

    def spans(self) -> dict[str, SleepValue]:
        return {name: decode(r.value, SleepValue) for name, r in self.results.items()}


def busy_lanes(queue: GpuQueue) -> int:
    return sum(lane.busy for lane in queue.statistics().lanes)


async def test_two_shared_jobs_on_one_gpu_run_at_the_same_time(config):
    async with GpuQueue(shared_gpu(config)) as queue, anyio.create_task_group() as tg:
        runs = Runs(queue, tg)
        runs.start("a", "sleep", 0.5)
        runs.start("b", "sleep", 0.5)
    spans = runs.spans()
    assert {r.gpu for r in runs.results.values()} == {0}
    assert runs.results["a"].worker_pid != runs.results["b"].worker_pid
    assert overlap(spans["a"], spans["b"])


async def test_a_timing_job_never_overlaps_another_job_on_its_gpu(config):
    kinds = ["sleep", "sleep", "sleep", "timed_sleep"] * 5
    async with GpuQueue(shared_gpu(config, gpus=(0, 1))) as queue, anyio.create_task_group() as tg:
        runs = Runs(queue, tg)
        for i, kind in enumerate(kinds):
            runs.start(f"{kind}-{i}", kind, 0.1)
    spans, results = runs.spans(), runs.results
    assert len(results) == len(kinds) and all(r.status is JobStatus.OK for r in results.values())
    for name in (n for n in spans if n.startswith("timed")):
        beside = [o for o in spans if o != name and results[o].gpu == results[name].gpu]
        assert not any(overlap(spans[name], spans[o]) for o in beside), name
    lanes = queue.statistics().lanes
    assert sorted((lane.gpu, lane.slot) for lane in lanes) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert sum(lane.exclusive_jobs for lane in lanes) == 5


@pytest.mark.parametrize("locks", [True, False])
async def test_a_timing_job_has_its_gpu_alone_from_another_queues_jobs_too(config, locks):
    """Two queues of one machine on GPU 0 (seeds of a benchmark at once): with the machine-wide
    locks, one queue's timing jobs overlap none of the other's jobs; without them they do."""
    from msgspec.structs import replace

    mine, other = (replace(shared_gpu(config), gpu_locks=locks, scratch_root=f"{config.scratch_root}-{k}")
                   for k in "ab")
    async with GpuQueue(other) as q_other, GpuQueue(mine) as q_mine, anyio.create_task_group() as tg:
        theirs, ours = Runs(q_other, tg), Runs(q_mine, tg)
        for i in range(8):
            theirs.start(f"shared-{i}", "sleep", 0.25)
        assert await eventually(lambda: busy_lanes(q_other) == 2)
        ours.start("timed-0", "timed_sleep", 0.25)
        ours.start("timed-1", "timed_sleep", 0.25)
    spans, timed = theirs.spans(), ours.spans()
    assert all(r.status is JobStatus.OK for r in (*theirs.results.values(), *ours.results.values()))
    overlapping = [(t, o) for t in timed for o in spans if overlap(timed[t], spans[o])]
    assert (overlapping == []) == locks, overlapping
    if locks:  # the other queue's later jobs waited for the timing jobs, not the other way round
        assert max(t.ended for t in timed.values()) < max(o.ended for o in spans.values())
    stats_mine, stats_other = q_mine.statistics(), q_other.statistics()
    # Each queue says how long its lanes waited for the other's jobs, and how much of its work had the GPU alone
    waited_s = [s.lock_wait_fraction * len(s.lanes) * s.uptime_s for s in (stats_mine, stats_other)]
    if locks:  # the timing jobs waited for the other's running jobs; its later jobs for the timing jobs
        assert waited_s[0] > 0.05 and waited_s[1] > 0.1, waited_s
    else:
        assert waited_s == [0.0, 0.0]
    assert stats_mine.busy_fraction > 0 and stats_mine.exclusive_busy_fraction == pytest.approx(stats_mine.busy_fraction)
    assert stats_other.exclusive_busy_fraction == 0 < stats_other.busy_fraction


async def test_another_queues_jobs_on_another_gpu_do_not_hold_up_a_timing_job(config):
    from msgspec.structs import replace

    other = replace(shared_gpu(config, gpus=(1,)), scratch_root=f"{config.scratch_root}-b")
    async with GpuQueue(other) as q_other, GpuQueue(shared_gpu(config)) as q_mine, anyio.create_task_group() as tg:
        theirs, ours = Runs(q_other, tg), Runs(q_mine, tg)
        theirs.start("shared", "sleep", 0.6)
        assert await eventually(lambda: busy_lanes(q_other) == 1)
        ours.start("timed", "timed_sleep", 0.2)
    assert overlap(theirs.spans()["shared"], ours.spans()["timed"])


async def test_a_waiting_timing_job_goes_before_shared_jobs_that_came_after_it(config):
    async with GpuQueue(shared_gpu(config)) as queue, anyio.create_task_group() as tg:
        runs = Runs(queue, tg)
        runs.start("a", "sleep", 0.4)
        runs.start("b", "sleep", 0.8)
        assert await eventually(lambda: busy_lanes(queue) == 2)
        runs.start("timed", "timed_sleep", 0.2)
        assert await eventually(lambda: queue.statistics().exclusive_depth == 1)
        for name in "cde":  # without the timing job ahead, c would take a's lane at once
            runs.start(name, "sleep", 0.2)
    spans = runs.spans()
    timed = spans["timed"]
    assert timed.started >= max(spans["a"].ended, spans["b"].ended)
    assert all(spans[name].started >= timed.ended for name in "cde")


async def test_a_pinned_timing_job_holds_up_only_its_own_gpu(config):
    async with GpuQueue(shared_gpu(config, gpus=(0, 1))) as queue, anyio.create_task_group() as tg:
        runs = Runs(queue, tg)
        runs.start("a", "sleep", 0.8, gpu=0)
        assert await eventually(lambda: busy_lanes(queue) == 1)
        runs.start("timed", "timed_sleep", 0.1, gpu=0)
        assert await eventually(lambda: queue.statistics().exclusive_depth == 1)
        runs.start("b", "sleep", 0.1)
    spans, results = runs.spans(), runs.results
    assert results["b"].gpu == 1 and spans["b"].ended < spans["a"].ended
    assert spans["timed"].started >= spans["a"].ended


async def test_an_unpinned_timing_job_gets_a_gpu_while_shared_jobs_keep_coming():
    """The dispatcher alone, two GPUs of two lanes: whenever a shared job ends another arrives,
    so neither GPU would ever be idle unless the timing job reserved one."""
    dispatcher = Dispatcher()
    for gpu, slot in itertools.product((0, 1), (0, 1)):
        dispatcher.release(Lane(gpu, Path("/nonexistent"), slot))
    held = [await dispatcher.acquire(None) for _ in range(4)]
    granted = []

    async def acquire(exclusive: bool):
        lane = await dispatcher.acquire(None, exclusive=exclusive)
        (granted if exclusive else held).append(lane)

    async with anyio.create_task_group() as tg:
        tg.start_soon(acquire, True)
        await anyio.wait_all_tasks_blocked()
        for _ in range(8):
            if granted:
                break
            dispatcher.release(held.pop(0))
            tg.start_soon(acquire, False)
            await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert granted and not any(lane.gpu == granted[0].gpu for lane in held)


async def test_a_cancelled_waiting_timing_job_releases_nothing_it_did_not_hold(config):
    async def timed_then_cancelled():
        with anyio.move_on_after(0.5):
            await queue.submit(job("timed_sleep", SleepArgs(seconds=0.1)))

    async with GpuQueue(shared_gpu(config)) as queue, anyio.create_task_group() as tg:
        runs = Runs(queue, tg)
        runs.start("a", "sleep", 1.5)
        assert await eventually(lambda: busy_lanes(queue) == 1)
        tg.start_soon(timed_then_cancelled)
        assert await eventually(lambda: queue.statistics().exclusive_depth == 1)
        runs.start("b", "sleep", 0.3)  # queued behind the timing job, though a lane is free
        assert await eventually(lambda: queue.statistics().depth == 2)
        assert await eventually(lambda: queue.statistics().exclusive_depth == 0)  # cancelled
        assert await eventually(lambda: busy_lanes(queue) == 2)  # its reservation went with it: b runs
        runs.start("timed", "timed_sleep", 0.1)
    spans = runs.spans()
    assert spans["b"].started < spans["a"].ended
    assert spans["timed"].started >= max(spans["a"].ended, spans["b"].ended)  # a and b still held the GPU


# ---------------------------------------------------------------------------------------------
# Staged timing jobs: prepare beside verification, time alone.


class Staged(msgspec.Struct, frozen=True):
    started: float  # its preparation began
    alone: float  # it had its GPU alone
    shared: float  # it shared its GPU again (its timing over)
    ended: float
    waited: float  # for its GPU alone, as the worker heard it
    asked: bool  # it had `ctx.gpu_alone` to ask with


def staged(result) -> Staged:
    started, alone, shared, ended, waited, asked = result.value.decode().split()
    return Staged(float(started), float(alone), float(shared), float(ended), float(waited), asked == "True")


def staged_job(prepare: float, timed: float, tail: float = 0.0, **fields) -> Job:
    return Job(job_id=f"job-{next(_ids)}", kind="staged_sleep", payload=f"{prepare} {timed} {tail}".encode(),
               **fields)


async def test_a_staged_job_prepares_beside_shared_jobs_and_times_alone(config):
    async with GpuQueue(shared_gpu(config)) as queue, anyio.create_task_group() as tg:
        runs = Runs(queue, tg)
        runs.start("a", "sleep", 1.0)
        assert await eventually(lambda: busy_lanes(queue) == 1)
        result = await queue.submit(staged_job(0.2, 0.3))
        runs.start("b", "sleep", 0.2)  # after the staged job: starts at once again
    a, mine = runs.spans()["a"], staged(result)
    assert result.status is JobStatus.OK and mine.asked
    assert mine.started < a.ended  # it prepared while `a` ran
    assert mine.alone >= a.ended - 0.01  # and timed only once `a` was done (the clocks: time.time)
    assert mine.waited == pytest.approx(a.ended - mine.started - 0.2, abs=0.15)
    assert result.wait_s >= mine.waited and result.alone_s == pytest.approx(0.3, abs=0.15)
    lanes = queue.statistics().lanes
    assert sum(lane.exclusive_jobs for lane in lanes) == 1
    assert queue.statistics().kinds["staged_sleep"].jobs == 1


async def test_a_staged_job_shares_its_gpu_again_once_it_times_nothing_more(config):
    async with GpuQueue(shared_gpu(config)) as queue, anyio.create_task_group() as tg:
        results = {}

        async def run_staged():
            results["staged"] = await queue.submit(staged_job(0.05, 0.4, 0.8))

        tg.start_soon(run_staged)
        assert await eventually(lambda: busy_lanes(queue) == 1)
        await anyio.sleep(0.2)  # it has the GPU alone: the other lane waits
        runs = Runs(queue, tg)
        runs.start("b", "sleep", 0.2)
        runs.start("x", "timed_sleep", 0.1)  # a timing job waits for both to end
    mine, spans, result = staged(results["staged"]), runs.spans(), results["staged"]
    assert result.status is JobStatus.OK and mine.asked
    assert spans["b"].started >= mine.shared - 0.01 and spans["b"].ended <= mine.ended  # b ran in its tail
    assert spans["x"].started >= mine.ended - 0.01
    assert result.alone_s == pytest.approx(0.4, abs=0.15)  # the tail is not counted alone
    assert sum(lane.exclusive_jobs for lane in queue.statistics().lanes) == 2


async def test_a_staged_job_shares_again_beside_another_queues_jobs(config):
    from msgspec.structs import replace

    other = replace(shared_gpu(config), scratch_root=f"{config.scratch_root}-b")
    async with GpuQueue(other) as q_other, GpuQueue(shared_gpu(config)) as q_mine, anyio.create_task_group() as tg:
        results = {}

        async def run_staged():
            results["staged"] = await q_mine.submit(staged_job(0.05, 0.4, 0.8))

        tg.start_soon(run_staged)
        assert await eventually(lambda: busy_lanes(q_mine) == 1)
        await anyio.sleep(0.2)
        theirs = Runs(q_other, tg)
        theirs.start("b", "sleep", 0.2)
    mine, spans = staged(results["staged"]), theirs.spans()
    assert spans["b"].started >= mine.shared - 0.01 and spans["b"].ended <= mine.ended


async def test_a_staged_job_that_never_asks_ends_as_a_shared_one(config):
    """A handler that fails before it is ready to time (or never times) never asks."""
    async with GpuQueue(shared_gpu(config)) as queue, anyio.create_task_group() as tg:
        runs = Runs(queue, tg)
        runs.start("a", "sleep", 0.5)
        runs.start("silent", "staged_silent", 0.5)
    assert all(r.status is JobStatus.OK for r in runs.results.values())
    spans = runs.spans()
    assert overlap(spans["a"], spans["silent"]) and runs.results["silent"].alone_s == 0.0


def test_a_result_frame_is_never_taken_for_an_ask():
    from rewards.queue.gpu_queue import _ask
    from rewards.queue.jobs import GpuAsk, JobResult

    assert _ask(encode(GpuAsk(wants="gpu_alone"))) == GpuAsk(wants="gpu_alone")
    assert _ask(encode(JobResult(job_id="j", status=JobStatus.OK, value=b"gpu_alone"))) is None


async def test_a_staged_job_asking_goes_before_waiting_shared_jobs(config):
    async with GpuQueue(shared_gpu(config)) as queue, anyio.create_task_group() as tg:
        runs = Runs(queue, tg)
        runs.start("a", "sleep", 0.8)
        assert await eventually(lambda: busy_lanes(queue) == 1)
        results = {}

        async def run_staged():
            results["staged"] = await queue.submit(staged_job(0.1, 0.3))

        tg.start_soon(run_staged)
        assert await eventually(lambda: queue.statistics().exclusive_depth == 1)  # asked, waits for `a`
        runs.start("b", "sleep", 0.1)  # a lane is free, but the GPU is kept for the staged job
    mine, spans = staged(results["staged"]), runs.spans()
    assert spans["b"].started >= mine.ended - 0.01


async def test_two_staged_jobs_of_one_gpu_never_wait_for_each_other(config):
    """Both prepare at once, then both ask: parked, neither holds the GPU from the other."""
    async with GpuQueue(shared_gpu(config)) as queue, anyio.create_task_group() as tg:
        results = {}

        async def run(name):
            results[name] = await queue.submit(staged_job(0.2, 0.3))

        for name in "xy":
            tg.start_soon(run, name)
    x, y = staged(results["x"]), staged(results["y"])
    assert all(r.status is JobStatus.OK for r in results.values())
    assert x.started < y.ended and y.started < x.ended  # prepared side by side
    first, second = sorted((x, y), key=lambda s: s.alone)
    assert second.alone >= first.ended - 0.01  # timed one after the other


async def test_a_staged_jobs_wait_for_its_gpu_is_not_counted_in_its_deadline(config):
    async with GpuQueue(shared_gpu(config)) as queue, anyio.create_task_group() as tg:
        runs = Runs(queue, tg)
        runs.start("a", "sleep", 1.5)
        assert await eventually(lambda: busy_lanes(queue) == 1)
        result = await queue.submit(staged_job(0.1, 0.2, deadline_s=1.0))
        late = await queue.submit(staged_job(0.1, 5.0, deadline_s=1.0))  # over its deadline alone
    assert result.status is JobStatus.OK and staged(result).waited > 1.0
    assert late.status is JobStatus.TIMEOUT


async def test_a_staged_job_its_gate_refuses_is_withdrawn_and_never_has_its_gpu_alone(config):
    """A final evaluation's profile job prepares beside its verification; the verification fails,
    so the gate says no when the job asks: it ends at once, withdrawn, and its worker lives on."""
    async with GpuQueue(shared_gpu(config)) as queue, anyio.create_task_group() as tg:
        runs = Runs(queue, tg)
        runs.start("verify", "sleep", 0.6)
        assert await eventually(lambda: busy_lanes(queue) == 1)
        asked = []

        async def failed() -> bool:
            asked.append(time.time())
            await eventually(lambda: "verify" in runs.results, 10.0)
            return False

        gated = Job(job_id=f"job-{next(_ids)}", kind="staged_gated", payload=b"0.1")
        result = await queue.submit(gated, gate=failed)
        after = await queue.submit(job("sleep", SleepArgs(seconds=0.01)))
    assert result.status is JobStatus.WITHDRAWN and "withdrawn" in result.error
    assert result.value.startswith(b"withdrawn: ") and result.alone_s == 0.0
    assert asked and asked[0] < runs.spans()["verify"].ended  # it prepared and asked while the verification ran
    assert after.status is JobStatus.OK and queue.statistics().restarts == 0


async def test_a_staged_jobs_wait_for_its_gate_is_not_counted_in_its_deadline(config):
    async with GpuQueue(shared_gpu(config)) as queue:
        async def passed_late() -> bool:
            await anyio.sleep(1.5)
            return True

        result = await queue.submit(staged_job(0.1, 0.2, deadline_s=1.0), gate=passed_late)
    mine = staged(result)
    assert result.status is JobStatus.OK and mine.asked and mine.waited > 1.4
    assert result.alone_s == pytest.approx(0.2, abs=0.15)


async def test_a_job_that_cannot_start_before_its_gate_waits_for_it_without_a_lane(config):
    """A timing job of a kind that is not staged has its GPU alone from the start: its gate is
    asked before it takes a lane, and a no withdraws it before it runs."""
    async with GpuQueue(one_lane(config)) as queue:
        refused = await queue.submit(job("timed_sleep", SleepArgs(seconds=0.01)), gate=_says(False))
        given = await queue.submit(job("timed_sleep", SleepArgs(seconds=0.01)), gate=_says(True))
    assert refused.status is JobStatus.WITHDRAWN and refused.worker_pid == 0 and "before it ran" in refused.error
    assert given.status is JobStatus.OK and given.alone_s > 0.0
    assert queue.statistics().kinds["timed_sleep"].jobs == 1


async def test_running_is_set_once_the_job_has_a_lane(config):
    async with GpuQueue(one_lane(config)) as queue, anyio.create_task_group() as tg:
        runs = Runs(queue, tg)
        first, second = anyio.Event(), anyio.Event()
        runs.start("first", "sleep", 0.5, running=first)
        await first.wait()
        runs.start("second", "sleep", 0.01, running=second)
        await anyio.sleep(0.2)
        assert not second.is_set()  # the one lane is still the first job's
        await second.wait()
        assert "first" in runs.results


def _says(answer: bool):
    async def gate() -> bool:
        return answer

    return gate


async def test_a_staged_job_has_its_gpu_alone_from_another_queues_jobs(config):
    from msgspec.structs import replace

    other = replace(shared_gpu(config), scratch_root=f"{config.scratch_root}-b")
    async with GpuQueue(other) as q_other, GpuQueue(shared_gpu(config)) as q_mine, anyio.create_task_group() as tg:
        theirs = Runs(q_other, tg)
        theirs.start("a", "sleep", 0.8)
        theirs.start("b", "sleep", 0.8)
        assert await eventually(lambda: busy_lanes(q_other) == 2)
        result = await q_mine.submit(staged_job(0.1, 0.3))
        theirs.start("c", "sleep", 0.1)
    mine, spans = staged(result), theirs.spans()
    assert mine.started < spans["a"].ended
    assert mine.alone >= max(spans["a"].ended, spans["b"].ended) - 0.01
    assert spans["c"].started >= mine.ended - 0.01


async def test_a_forked_staged_job_has_its_gpu_alone_from_the_start(config):
    from msgspec.structs import replace

    async with GpuQueue(replace(shared_gpu(config), fork_per_job=True)) as queue, anyio.create_task_group() as tg:
        runs = Runs(queue, tg)
        runs.start("a", "sleep", 0.6)
        assert await eventually(lambda: busy_lanes(queue) == 1)
        result = await queue.submit(staged_job(0.1, 0.1))
    mine = staged(result)
    assert not mine.asked and mine.started >= runs.spans()["a"].ended - 0.01
    assert result.alone_s == pytest.approx(result.wall_s, abs=0.01)


async def test_a_lane_is_spare_only_while_free_and_unwanted():
    dispatcher = Dispatcher()
    assert not dispatcher.spare()  # no lane yet
    dispatcher.release(Lane(0, Path("/nonexistent"), 0))
    assert dispatcher.spare()
    held = await dispatcher.acquire(0)
    assert not dispatcher.spare()  # none free
    async with anyio.create_task_group() as tg:
        tg.start_soon(dispatcher.acquire, 0)  # a waiter: the lane it gets next is wanted
        await eventually(lambda: dispatcher.depth() == 1)
        assert not dispatcher.spare()
        dispatcher.release(held)
    assert not dispatcher.spare()  # the waiter took it


async def test_the_dispatcher_gives_a_staged_lane_its_gpu_once_the_others_end():
    dispatcher = Dispatcher()
    for slot in range(3):
        dispatcher.release(Lane(0, Path("/nonexistent"), slot))
    staged_lane, other = await dispatcher.acquire(0), await dispatcher.acquire(0)
    granted = []

    async def alone():
        await dispatcher.alone(staged_lane)
        granted.append(staged_lane)

    async def shared():
        granted.append(await dispatcher.acquire(0))

    async with anyio.create_task_group() as tg:
        tg.start_soon(alone)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(shared)  # the third lane is free, but the GPU is kept for the staged lane
        await anyio.wait_all_tasks_blocked()
        assert granted == []
        dispatcher.release(other)
        await anyio.wait_all_tasks_blocked()
        assert granted == [staged_lane]
        await dispatcher.alone(staged_lane)  # it has it already: at once
        dispatcher.shared(staged_lane)  # it times nothing more: the waiting shared job starts beside it
        await anyio.wait_all_tasks_blocked()
        assert len(granted) == 2 and granted[1] is not staged_lane
        dispatcher.release(staged_lane)


# ---------------------------------------------------------------------------------------------
# Failures: each is a status, and the lane goes on.


async def test_hanging_job_is_killed_at_its_deadline_and_the_lane_gets_a_new_worker(config):
    async with GpuQueue(one_lane(config)) as queue:
        hung = await queue.submit(job("sleep", SleepArgs(seconds=60), deadline_s=0.5))
        after = await queue.submit(job("ping"))
    assert hung.status is JobStatus.TIMEOUT
    assert hung.wall_s < 10
    assert after.status is JobStatus.OK
    assert after.worker_pid != hung.worker_pid and not alive(hung.worker_pid)


@pytest.mark.parametrize("how", ["exit", "segfault", "abort"])
async def test_crashing_job_is_reported_crashed_and_the_next_job_succeeds(config, how):
    async with GpuQueue(one_lane(config)) as queue:
        crashed = await queue.submit(job("crash", CrashArgs(how=how)))
        after = await queue.submit(job("ping"))
    assert crashed.status is JobStatus.CRASHED
    assert "crash handler: dying by" in crashed.error  # the worker's stderr tail
    assert after.status is JobStatus.OK and after.worker_pid != crashed.worker_pid


async def test_poisoned_cuda_context_is_reported_and_the_worker_replaced(config):
    async with GpuQueue(one_lane(config)) as queue:
        poisoned = await queue.submit(job("cuda_poison"))
        after = await queue.submit(job("ping"))
    assert poisoned.status is JobStatus.CUDA_POISONED
    assert "illegal memory access" in poisoned.error
    assert after.status is JobStatus.OK and after.worker_pid != poisoned.worker_pid


async def test_handler_error_is_a_result_and_keeps_the_worker(config):
    async with GpuQueue(one_lane(config)) as queue:
        failed = await queue.submit(job("no_such_kind"))
        after = await queue.submit(job("ping"))
    assert failed.status is JobStatus.ERROR and "no_such_kind" in failed.error
    assert after.worker_pid == failed.worker_pid


async def test_handler_prints_do_not_corrupt_the_channel(config):
    noise = PrintArgs(text="x" * 999 + '{"status": "ok"}', times=300)  # ~600 KB through every path
    async with GpuQueue(one_lane(config)) as queue:
        noisy = await queue.submit(job("print", noise))
        after = await queue.submit(job("ping"))
    assert (noisy.status, noisy.value) == (JobStatus.OK, b"done")
    assert after.status is JobStatus.OK and after.worker_pid == noisy.worker_pid


async def test_cancelled_submit_frees_the_lane_for_the_next_job(config):
    async with GpuQueue(one_lane(config)) as queue:
        with anyio.move_on_after(0.3):
            await queue.submit(job("sleep", SleepArgs(seconds=60)))
        with anyio.fail_after(10):
            after = await queue.submit(job("ping"))
    assert after.status is JobStatus.OK


async def test_worker_that_cannot_start_raises(config):
    broken = one_lane(config, preload=("no_such_module_anywhere",))
    with pytest.raises(WorkerStartError, match="no_such_module_anywhere"):
        async with GpuQueue(broken):
            pass


# ---------------------------------------------------------------------------------------------
# Fork per job.


async def test_fork_per_job_runs_each_job_in_a_fresh_process(config):
    async with GpuQueue(one_lane(config, fork_per_job=True)) as queue:
        first = await queue.submit(job("echo_env"))
        second = await queue.submit(job("echo_env"))
    assert first.worker_pid == second.worker_pid
    assert decode(first.value, EchoEnvValue).pid != decode(second.value, EchoEnvValue).pid


async def test_fork_per_job_crash_costs_no_worker_restart(config):
    async with GpuQueue(one_lane(config, fork_per_job=True)) as queue:
        crashed = await queue.submit(job("crash", CrashArgs(how="segfault")))
        after = await queue.submit(job("ping"))
        stats = queue.statistics()
    assert crashed.status is JobStatus.CRASHED and "SIGSEGV" in crashed.error
    assert after.status is JobStatus.OK and after.worker_pid == crashed.worker_pid
    assert (stats.crashes, stats.restarts) == (1, 0)


async def test_fork_per_job_poisoned_child_leaves_the_zygote_serving(config):
    async with GpuQueue(one_lane(config, fork_per_job=True)) as queue:
        poisoned = await queue.submit(job("cuda_poison"))
        after = await queue.submit(job("ping"))
    assert poisoned.status is JobStatus.CUDA_POISONED
    assert after.status is JobStatus.OK and after.worker_pid == poisoned.worker_pid


# ---------------------------------------------------------------------------------------------
# Statistics and shutdown.


async def test_statistics_count_jobs_and_failures(config):
    async with GpuQueue(one_lane(config)) as queue:
        for j in [
            job("ping"),
            job("sleep", SleepArgs(seconds=60), deadline_s=0.3),
            job("crash"),
            job("cuda_poison"),
            job("no_such_kind"),
        ]:
            await queue.submit(j)
        await queue.submit(job("ping"))  # waits for the third replacement worker
        stats = queue.statistics()
    lane = stats.lanes[0]
    counts = (stats.jobs_done, stats.timeouts, stats.crashes, stats.poisoned, stats.restarts)
    assert counts == (6, 1, 1, 1, 3)
    assert (lane.jobs_done, lane.restarts, lane.busy) == (6, 3, False)
    assert 0.0 < stats.busy_fraction < 1.0 and stats.depth == 0


async def test_statistics_time_each_job_kind_apart(config):
    """Per kind: jobs finished, their mean run time, and their mean wait for a lane (on one lane the
    second of two 0.3 s sleeps waits for the first)."""
    async with GpuQueue(one_lane(config)) as queue:
        async with anyio.create_task_group() as tg:
            runs = Runs(queue, tg)
            runs.start("first", "sleep", 0.3)
            runs.start("second", "sleep", 0.3)
        await queue.submit(job("ping"))
        kinds = queue.statistics().kinds
    assert all(r.status is JobStatus.OK for r in runs.results.values())
    assert set(kinds) == {"sleep", "ping"} and (kinds["sleep"].jobs, kinds["ping"].jobs) == (2, 1), kinds
    assert kinds["sleep"].run_s >= 0.3 and kinds["sleep"].wait_s >= 0.3 / 2, kinds  # one waited a whole sleep


async def test_statistics_tell_a_kinds_wait_for_another_queues_job_from_its_run(config):
    """A shared job behind another queue's timing job on its GPU holds its lane waiting for the
    machine-wide lock: that wait is its `lock_s`, not its `run_s` or its wait for a lane."""
    from msgspec.structs import replace

    mine, other = (replace(one_lane(config), scratch_root=f"{config.scratch_root}-{k}") for k in "ab")
    async with GpuQueue(other) as q_other, GpuQueue(mine) as q_mine, anyio.create_task_group() as tg:
        theirs, ours = Runs(q_other, tg), Runs(q_mine, tg)
        theirs.start("timed", "timed_sleep", 0.8)
        assert await eventually(lambda: busy_lanes(q_other) == 1)
        ours.start("shared", "sleep", 0.2)
    mine_kinds, other_kinds = q_mine.statistics().kinds, q_other.statistics().kinds
    shared, times = ours.results["shared"], mine_kinds["sleep"]
    assert shared.status is JobStatus.OK and times.jobs == 1
    assert times.lock_s >= 0.4 and times.run_s >= 0.2, mine_kinds
    # The job's own record splits the same way: its wall is the run, its wait the lane and the lock.
    assert times.run_s == pytest.approx(shared.wall_s) and times.wait_s + times.lock_s == pytest.approx(shared.wait_s)
    assert other_kinds["timed_sleep"].jobs == 1 and other_kinds["timed_sleep"].run_s >= 0.8, other_kinds


async def test_depth_counts_submitters_waiting_for_a_lane(config):
    async with GpuQueue(one_lane(config)) as queue, anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(queue.submit, job("sleep", SleepArgs(seconds=0.5)))
        await anyio.sleep(0.2)
        stats = queue.statistics()
    assert (stats.depth, stats.lanes[0].busy) == (2, True)


async def test_shutdown_leaves_no_worker_processes(config):
    async with GpuQueue(config) as queue:
        pids = [lane.worker_pid for lane in queue.statistics().lanes]
        async with anyio.create_task_group() as tg:
            tg.start_soon(queue.submit, job("sleep", SleepArgs(seconds=60)))
            await anyio.sleep(0.3)
            tg.cancel_scope.cancel()
    assert pids and not any(alive(pid) for pid in pids)


async def test_shutdown_kills_what_a_job_left_running(config):
    seconds = unique_seconds()
    async with GpuQueue(one_lane(config)) as queue:
        await queue.submit(Job(job_id="bg", kind="spawn", payload=seconds.encode()))
        started = await eventually(lambda: processes_with_arg(seconds))
    gone = await eventually(lambda: not processes_with_arg(seconds))
    assert started and gone


async def test_submit_after_shutdown_raises(config):
    async with GpuQueue(one_lane(config)) as queue:
        pass
    with pytest.raises(QueueClosed):
        await queue.submit(job("ping"))


# ---------------------------------------------------------------------------------------------
# The sandbox.


@functools.cache
def bwrap_unavailable() -> str | None:
    path = shutil.which("bwrap")
    if path is None:
        return "bwrap is not installed"
    probe = [path, "--unshare-all", "--unshare-user", "--disable-userns", "--ro-bind", "/", "/", "true"]
    result = subprocess.run(probe, check=False, capture_output=True, text=True)
    return f"bwrap cannot make namespaces here: {result.stderr.strip()}" if result.returncode else None


needs_bwrap = pytest.mark.skipif(bwrap_unavailable() is not None, reason=str(bwrap_unavailable()))


@needs_bwrap
async def test_sandboxed_job_can_write_only_its_scratch_dir(config, outside_dir, tmp_path):
    scratch = Path(config.scratch_root) / "gpu0"
    paths = [scratch / "ok", outside_dir / "no", tmp_path / "no", Path("/tmp/no"), Path.home() / "no"]
    async with GpuQueue(one_lane(config, sandbox=True)) as queue:
        result = await queue.submit(job("echo_env", EchoEnvArgs(write_paths=tuple(map(str, paths)))))
    writable = decode(result.value, EchoEnvValue).writable
    assert writable == {str(p): p == scratch / "ok" for p in paths}


@needs_bwrap
async def test_sandboxed_job_gets_the_configured_env_and_writable_paths(config, outside_dir):
    cache = outside_dir / "cache"  # made by the queue
    paths = [cache / "ok", outside_dir / "no"]
    lane = one_lane(config, sandbox=True, writable_paths=(str(cache),),
                    env={"TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCHINDUCTOR_COMPILE_THREADS": "4"})
    probe = EchoEnvArgs(write_paths=tuple(map(str, paths)),
                        env_names=("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_COMPILE_THREADS"))
    async with GpuQueue(lane) as queue:
        result = await queue.submit(job("echo_env", probe))
    value = decode(result.value, EchoEnvValue)
    assert value.writable == {str(paths[0]): True, str(paths[1]): False}
    assert value.env == {"TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCHINDUCTOR_COMPILE_THREADS": "4"}


@needs_bwrap
async def test_forked_jobs_compile_with_their_own_inductor_pool(config):
    """compile_threads > 1: each forked child compiles with a pool of its own; the stray reaper
    kills it after the job and the next child starts a new one."""
    lane = one_lane(config, sandbox=True, fork_per_job=True, compile_threads=2, preload=("torch",),
                    job_default_deadline_s=240.0)
    async with GpuQueue(lane) as queue:
        results = [await queue.submit(Job(job_id=f"compile-{k}", kind="compile_sum", payload=str(k).encode()))
                   for k in (2, 3)]
    assert [r.status for r in results] == [JobStatus.OK, JobStatus.OK], [r.error[-500:] for r in results]
    assert [r.value.decode() for r in results] == ["2 64.0", "2 92.0"]


def test_a_long_lived_worker_compiles_in_one_thread_whatever_is_asked(config, tmp_path):
    env = worker_env(one_lane(config, compile_threads=8), 0, tmp_path)
    forked = worker_env(one_lane(config, compile_threads=8, fork_per_job=True), 0, tmp_path)
    assert (env["TORCHINDUCTOR_COMPILE_THREADS"], forked["TORCHINDUCTOR_COMPILE_THREADS"]) == ("1", "8")


def test_workers_default_to_one_cpu_thread_unless_asked_or_set(config, tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    env = worker_env(config, 0, tmp_path)
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("1", "1")
    assert worker_env(one_lane(config, cpu_threads=3, sandbox=True), 0, tmp_path)["OMP_NUM_THREADS"] == "3"
    monkeypatch.setenv("OMP_NUM_THREADS", "5")  # the user's own setting wins
    assert worker_env(one_lane(config, cpu_threads=3, sandbox=True), 0, tmp_path)["OMP_NUM_THREADS"] == "5"


@pytest.mark.parametrize("sandbox", [False, pytest.param(True, marks=needs_bwrap)])
async def test_a_workers_torch_and_its_children_use_the_configured_cpu_threads(config, sandbox, monkeypatch):
    """Lanes share the machine's cores: torch in a worker, and in the processes its jobs start,
    runs `cpu_threads` threads, not one per core."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    lane = one_lane(config, sandbox=sandbox, cpu_threads=1, job_default_deadline_s=120.0)
    async with GpuQueue(lane) as queue:
        result = await queue.submit(job("torch_threads"))
    assert result.status is JobStatus.OK, result.error[-500:]
    assert result.value.decode() == "1 1"  # torch alone takes one per core (at most)


@needs_bwrap
async def test_sandboxed_job_cannot_reach_the_network(config):
    with socket.create_server(("127.0.0.1", 0)) as server:
        address = f"127.0.0.1:{server.getsockname()[1]}"
        async with GpuQueue(config) as open_queue:  # control: the listener is reachable
            control = await open_queue.submit(job("echo_env", EchoEnvArgs(connect=address)))
        async with GpuQueue(one_lane(config, sandbox=True)) as queue:
            result = await queue.submit(job("echo_env", EchoEnvArgs(connect=address)))
    assert decode(control.value, EchoEnvValue).connect_ok is True
    assert decode(result.value, EchoEnvValue).connect_ok is False


@needs_bwrap
async def test_sandboxed_job_cannot_read_hidden_paths(config, outside_dir):
    (outside_dir / "reference").mkdir()
    secret = outside_dir / "reference" / "model.py"
    secret.write_text("class Model: ...")
    hidden = one_lane(config, sandbox=True, hidden_paths=(str(outside_dir / "reference"),))
    async with GpuQueue(hidden) as queue:
        result = await queue.submit(job("echo_env", EchoEnvArgs(read_paths=(str(secret),))))
    assert decode(result.value, EchoEnvValue).read_bytes == {str(secret): -1}


@needs_bwrap
async def test_sandboxed_job_sees_none_of_the_hosts_secrets(config, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    probe = EchoEnvArgs(env_names=("HF_TOKEN", "PATH"))
    async with GpuQueue(one_lane(config, sandbox=True)) as queue:
        result = await queue.submit(job("echo_env", probe))
    assert set(decode(result.value, EchoEnvValue).env) == {"PATH"}


@needs_bwrap
async def test_sandboxed_background_process_dies_with_its_job(config):
    seconds = unique_seconds()
    async with GpuQueue(one_lane(config, sandbox=True)) as queue:
        spawned = await queue.submit(Job(job_id="bg", kind="spawn", payload=f"{seconds} detached".encode()))
        gone = await eventually(lambda: not processes_with_arg(seconds), timeout_s=2.0)
    assert spawned.status is JobStatus.OK and gone


@needs_bwrap
async def test_sandboxed_hanging_job_times_out_and_lane_recovers(config):
    async with GpuQueue(one_lane(config, sandbox=True, fork_per_job=True)) as queue:
        hung = await queue.submit(job("sleep", SleepArgs(seconds=60), deadline_s=0.5))
        after = await queue.submit(job("ping"))
    assert hung.status is JobStatus.TIMEOUT and after.status is JobStatus.OK
    assert not alive(hung.worker_pid)


@pytest.mark.gpu
async def test_sandboxed_worker_runs_cuda_on_its_one_gpu(config):
    from rewards.queue.jobs import CudaProbeValue, decode

    async with GpuQueue(one_lane(config, sandbox=True)) as queue:
        result = await queue.submit(Job(job_id="probe", kind="cuda_probe"))
    assert result.status is JobStatus.OK, result.error
    value = decode(result.value, CudaProbeValue)
    assert value.device_count == 1 and value.total == float(1 << 20)


@needs_bwrap
async def test_sandboxed_worker_starts_from_a_virtualenv_under_tmp(config, tmp_path):
    python = make_venv(Path(tempfile.mkdtemp(prefix="venv-test-", dir="/tmp")))
    assert str(python).startswith("/tmp/")
    try:
        async with GpuQueue(one_lane(config, sandbox=True, python=str(python))) as queue:
            result = await queue.submit(Job(job_id="venv", kind="shout", payload=b"from tmp"))
        assert result.status == JobStatus.OK and result.value == b"FROM TMP"
    finally:
        shutil.rmtree(python.parents[2], ignore_errors=True)
