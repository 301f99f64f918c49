"""The machine-wide lock of a GPU (`rewards.queue.gpu_lock`): shared holders beside each other, an
exclusive one alone, no new shared holder once an exclusive one waits, nothing held by a waiter
that was cancelled or by a process that died. The queues' use of it: `tests/test_gpu_queue.py`."""

from __future__ import annotations

import subprocess
import sys
import time

import anyio
import pytest

from rewards.queue.gpu_lock import GpuLocks


@pytest.fixture
def locks(tmp_path) -> GpuLocks:
    return GpuLocks(tmp_path / "locks", poll_s=0.002)


async def hold_for(locks: GpuLocks, device: str, exclusive: bool, seconds: float, log: list, name: str) -> None:
    async with locks.hold(device, exclusive=exclusive):
        log.append((name, "in", time.monotonic()))
        await anyio.sleep(seconds)
        log.append((name, "out", time.monotonic()))


def spans(log: list) -> dict[str, tuple[float, float]]:
    start = {n: t for n, what, t in log if what == "in"}
    return {n: (start[n], t) for n, what, t in log if what == "out"}


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


async def test_shared_holders_overlap_and_an_exclusive_one_overlaps_none(locks):
    log: list = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(hold_for, locks, "0", False, 0.2, log, "s1")
        tg.start_soon(hold_for, locks, "0", False, 0.2, log, "s2")
        await anyio.sleep(0.05)
        tg.start_soon(hold_for, locks, "0", True, 0.1, log, "x")
        tg.start_soon(hold_for, locks, "1", True, 0.1, log, "other-gpu")
    s = spans(log)
    assert overlap(s["s1"], s["s2"])
    assert not overlap(s["x"], s["s1"]) and not overlap(s["x"], s["s2"])
    assert overlap(s["other-gpu"], s["s1"])  # another GPU's lock is another lock


async def test_no_shared_holder_enters_once_an_exclusive_one_waits(locks):
    log: list = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(hold_for, locks, "0", False, 0.2, log, "first")
        await anyio.sleep(0.05)
        tg.start_soon(hold_for, locks, "0", True, 0.1, log, "x")
        await anyio.sleep(0.05)
        tg.start_soon(hold_for, locks, "0", False, 0.1, log, "later")
    s = spans(log)
    assert s["first"][1] <= s["x"][0] and s["x"][1] <= s["later"][0]


async def staged_for(locks: GpuLocks, prepare: float, timed: float, log: list, name: str) -> None:
    """Shared while it prepares, then alone (`Hold.alone`) while it times."""
    async with locks.hold("0", exclusive=False) as hold:
        log.append((f"{name}-prepare", "in", time.monotonic()))
        await anyio.sleep(prepare)
        log.append((f"{name}-prepare", "out", time.monotonic()))
        await hold.alone()
        log.append((name, "in", time.monotonic()))
        await anyio.sleep(timed)
        log.append((name, "out", time.monotonic()))


async def test_a_staged_holder_prepares_beside_shared_ones_and_times_alone(locks):
    log: list = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(hold_for, locks, "0", False, 0.3, log, "s1")
        await anyio.sleep(0.05)
        tg.start_soon(staged_for, locks, 0.05, 0.1, log, "x")
        await anyio.sleep(0.15)  # x asked and waits for s1; the gate is closed
        tg.start_soon(hold_for, locks, "0", False, 0.1, log, "later")
    s = spans(log)
    assert overlap(s["x-prepare"], s["s1"])
    assert s["s1"][1] <= s["x"][0] and s["x"][1] <= s["later"][0]


async def test_a_staged_holder_that_times_nothing_more_shares_again_until_it_ends(locks):
    log: list = []
    async with anyio.create_task_group() as tg:

        async def staged() -> None:
            async with locks.hold("0", exclusive=False) as hold:
                await hold.alone()
                log.append(("timed", "in", time.monotonic()))
                await anyio.sleep(0.1)
                log.append(("timed", "out", time.monotonic()))
                await hold.shared()
                log.append(("tail", "in", time.monotonic()))
                await anyio.sleep(0.3)
                log.append(("tail", "out", time.monotonic()))

        tg.start_soon(staged)
        await anyio.sleep(0.05)  # it times: both wait, the shared one at the gate
        tg.start_soon(hold_for, locks, "0", False, 0.1, log, "shared")
        await anyio.sleep(0.01)
        tg.start_soon(hold_for, locks, "0", True, 0.05, log, "x")
    s = spans(log)
    assert s["timed"][1] <= s["shared"][0] and overlap(s["shared"], s["tail"])
    assert s["x"][0] >= s["tail"][1] and s["x"][0] >= s["shared"][1]  # an exclusive one waits for both


async def test_two_staged_holders_never_wait_for_each_other(locks):
    log: list = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(staged_for, locks, 0.1, 0.1, log, "x")
            tg.start_soon(staged_for, locks, 0.1, 0.1, log, "y")
    s = spans(log)
    assert overlap(s["x-prepare"], s["y-prepare"]) and not overlap(s["x"], s["y"])


async def test_a_cancelled_waiter_holds_nothing(locks):
    async with locks.hold("0", exclusive=True):
        with anyio.move_on_after(0.05) as scope:
            async with locks.hold("0", exclusive=False):
                pytest.fail("entered while another holder had the GPU alone")
        assert scope.cancelled_caught
        with anyio.move_on_after(0.05):
            async with locks.hold("0", exclusive=True):
                pytest.fail("entered while another holder had the GPU alone")
    with anyio.fail_after(1):  # both cancelled waiters left nothing behind
        async with locks.hold("0", exclusive=True):
            pass


async def test_another_process_holds_the_gpu_until_it_dies(locks):
    """Another queue's process with a timing job: the kernel drops its lock when it is killed."""
    code = ("import anyio, sys\nfrom rewards.queue.gpu_lock import GpuLocks\n"
            "async def main():\n"
            "    async with GpuLocks(sys.argv[1]).hold('0', exclusive=True):\n"
            "        print('held', flush=True)\n"
            "        await anyio.sleep(60)\n"
            "anyio.run(main)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(locks.directory)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
        with anyio.move_on_after(0.3) as scope:
            async with locks.hold("0", exclusive=False):
                pytest.fail("entered while another process had the GPU alone")
        assert scope.cancelled_caught
        proc.kill()
        proc.wait()
        with anyio.fail_after(2):
            async with locks.hold("0", exclusive=True):
                pass
    finally:
        proc.kill()
        proc.wait()


def test_a_device_name_is_a_file_name(locks):
    async def main() -> None:
        async with locks.hold("GPU-1234/../x", exclusive=True):
            pass

    anyio.run(main)
    assert sorted(p.name for p in locks.directory.iterdir()) == ["GPU-1234_.._x.gate", "GPU-1234_.._x.gpu"]
