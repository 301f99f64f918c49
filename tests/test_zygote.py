"""The zygote launcher of candidate and profile children (rewards.queue.zygote), on the CPU:
with `child_launcher="zygote"` verifications give the verdicts "spawn" gives, each job gets a
fresh child forked by the zygote with the spawned child's properties (own process group, the
channel fds at their numbers and nothing else, the worker's resource limits), timeouts and
close kill the child's group, a dead zygote is restarted and a zygote that cannot start means
spawn. The child's import phase is zero: the zygote imported everything once, and paid a first
torch.compile's imports and hashes without CUDA, threads or files; its children still compile.
With a spare child (CUDA_AGENT_SPARE_CHILD=1) the next request goes to a child forked ahead, the
next spare comes when a child exits, the sandboxed worker's reaper spares it, and a spare that
died means a forked child; on a GPU the spare made its CUDA context before its request.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest

from rewards.queue import process_state, zygote, zygote_server
from rewards.queue.jobs import Job, encode
from rewards.timing.profile import ProfileConfig, ProfileRequest, time_candidate
from rewards.timing.sampling import TimingConfig
from rewards.verdict import HackCategory, VerdictStatus
from rewards.verify.phases import Phases
from rewards.verify.verifier import (
    CandidateProcess,
    VerifyConfig,
    VerifyRequest,
    job_files,
    run_verification,
    verdict_from_job,
)

TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.relu(self.linear(x))

def get_inputs():
    return [torch.rand(16, 8)]

def get_init_inputs():
    return [8]
"""

LINEAR = "torch.relu(F.linear(x, self.linear.weight, self.linear.bias))"


def candidate(forward: str) -> str:
    body = "\n".join("        " + line for line in forward.strip().splitlines())
    return (
        "import os\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
        "class ModelNew(nn.Module):\n    def __init__(self, features):\n        super().__init__()\n"
        "        self.linear = nn.Linear(features, features)\n        self.cache = None\n\n"
        f"    def forward(self, x):\n{body}\n"
    )


HONEST = candidate(f"return {LINEAR}")
CACHING = candidate(f"if self.cache is None:\n    self.cache = {LINEAR}\nreturn self.cache")


@pytest.fixture(scope="module", autouse=True)
def one_zygote_per_module():
    """One zygote serves the module's tests, as one serves a worker's jobs (its start costs the
    imports); tests that need another kill or shut it down themselves."""
    yield
    zygote.shutdown()


def verify(tmp_path: Path, text: str, launcher: str, **config):
    cand = tmp_path / "candidate"
    cand.mkdir(parents=True, exist_ok=True)
    (cand / "model_new.py").write_text(text)
    config = VerifyConfig(allow_torch_compute=True, child_launcher=launcher, **config)
    return run_verification(VerifyRequest(task_source=TASK, device="cpu", seed=5, config=config), work_dir=tmp_path)


def _gone(pid: int) -> bool:
    """Dead: no such process, or a zombie nobody reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _zygote_pid() -> int:
    pid = zygote._current.process.pid
    assert pid in zygote.spared_pids()
    return pid


@pytest.mark.parametrize(("text", "status", "hack"), [(HONEST, VerdictStatus.OK, None),
                                                      (CACHING, VerdictStatus.HACK, HackCategory.OUTPUT_CACHING)],
                         ids=["honest", "output_caching"])
def test_zygote_gives_the_verdict_spawn_gives(tmp_path, text, status, hack):
    spawned = verify(tmp_path / "spawn", text, "spawn")
    forked = verify(tmp_path / "zygote", text, "zygote")
    assert (spawned.status, spawned.hack) == (status, hack), spawned
    assert (forked.status, forked.hack, forked.trials) == (spawned.status, spawned.hack, spawned.trials), forked
    assert forked.message == spawned.message


def test_failures_of_the_candidate_read_the_same(tmp_path):
    raised = verify(tmp_path / "a", candidate("raise ValueError('boom')"), "zygote")
    crashed = verify(tmp_path / "b", candidate("os._exit(3)"), "zygote")
    assert raised.status is VerdictStatus.RUNTIME_ERROR and "ValueError: boom" in raised.message
    assert crashed.status is VerdictStatus.RUNTIME_ERROR and "exit status 3" in crashed.message


def test_forked_child_reports_no_import_and_a_new_process(tmp_path):
    phases = verify(tmp_path, HONEST, "zygote").phases_ms
    assert phases["child.import"] == 0.0
    assert {"child.interpreter", "child.warm_up", "child.build", "spawn", "load"} <= set(phases)


def test_each_job_gets_a_fresh_child_of_the_zygote_in_its_own_group(tmp_path):
    pids = []
    for _ in range(2):
        child = CandidateProcess(tmp_path, launcher="zygote")
        child.start()
        pid = child.process.pid
        assert isinstance(child.process, zygote.ForkedProcess)
        assert _ppid(pid) == _zygote_pid() and os.getpgid(pid) == pid
        child.close()
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
        pids.append(pid)
    assert pids[0] != pids[1]


def _wait_for(predicate, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture(params=["fork", "spare"])
def either(request, monkeypatch):
    """A zygote that forks each request, or one that hands it to a spare child."""
    if request.param == "spare":
        monkeypatch.setenv(zygote_server.SPARE_ENV, "1")
    zygote.shutdown()
    yield request.param
    zygote.shutdown()


def test_child_has_the_channel_fds_at_their_numbers_and_no_other(tmp_path, either):
    child = CandidateProcess(tmp_path, launcher="zygote")
    child.start()
    read_fd, write_fd = int(child.process.args[2]), int(child.process.args[4])
    fd_dir = f"/proc/{child.process.pid}/fd"
    try:
        assert _wait_for(lambda: {int(fd) for fd in os.listdir(fd_dir)} == {0, 1, 2, read_fd, write_fd})
        assert os.readlink(f"{fd_dir}/1") == str(child.log_path) == os.readlink(f"{fd_dir}/2")
        assert os.readlink(f"{fd_dir}/0") == os.devnull
    finally:
        child.close()


_KEEPS_DRIVER_FDS = """
import json, os, sys
from rewards.queue import zygote_server as z

with z._opened_above(64) as opened:
    device = os.open("/dev/zero", os.O_RDONLY)  # as the CUDA driver opens /dev/nvidia*
    os.close(os.open("/dev/null", os.O_RDONLY))  # opened and closed again: not kept
free = os.open("/dev/null", os.O_RDONLY)
os.close(free)
r, w = os.pipe()
log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)
z._place_fds(log, [r], [5], opened)
print(json.dumps({"open": sorted(z._open_fds()), "device": device, "kept": sorted(opened),
                  "target": os.readlink(f"/proc/self/fd/{device}"), "free": free}), flush=True)
try:
    z._place_fds(5, [], [device], opened)
except ValueError as exc:
    print(exc, flush=True)
"""


def test_fds_opened_ahead_land_above_the_requests_numbers_and_stay_open(tmp_path):
    """A spare makes its CUDA context with the low fd numbers taken (`_opened_above`), and its
    child keeps what that opened (the driver's device fds) when its own fds are placed."""
    log = tmp_path / "log"
    subprocess.run([sys.executable, "-c", _KEEPS_DRIVER_FDS, str(log)], check=True, timeout=120,
                   env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[1])})
    first, second = log.read_text().splitlines()
    seen = json.loads(first)
    device = seen["device"]
    assert device >= 64 and seen["open"] == [0, 1, 2, 5, device]
    assert (seen["kept"], seen["target"]) == ([device], "/dev/zero")
    assert seen["free"] < 64  # the low numbers are free again
    assert second == f"fd {device} is both kept and a target"


def test_a_request_for_fd_numbers_above_the_spares_is_forked_instead():
    def request(*targets: int) -> bytes:
        return zygote_server.encode(zygote_server.Fork(
            module="rewards.verify.candidate", args=(), cwd="/", env={}, pass_fds=targets, rlimits={}))

    below = zygote_server.SPARE_LOW_FDS
    assert zygote_server._acceptable(request(5, below - 1), [0, 1, 2], below=below)
    assert not zygote_server._acceptable(request(5, below), [0, 1, 2], below=below)
    assert zygote_server._acceptable(request(5, below), [0, 1, 2])


def test_child_gets_the_workers_resource_limits_of_now(tmp_path):
    child = CandidateProcess(tmp_path, launcher="zygote")
    child.start()  # the zygote now exists, with the limits of its start
    child.close()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (12345 * 1024, hard))
    try:
        child = CandidateProcess(tmp_path, launcher="zygote")
        child.start()
        limits = Path(f"/proc/{child.process.pid}/limits")
        assert _wait_for(lambda: f"Max file size             {12345 * 1024}" in limits.read_text())
        child.close()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_timed_out_candidate_is_killed_with_its_group(tmp_path):
    pids = tmp_path / "pids"
    forward = (f"import subprocess, time\np = subprocess.Popen(['sleep', '60'])\n"
               f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{p.pid}}')\ntime.sleep(60)\nreturn x")
    verdict = verify(tmp_path, candidate(forward), "zygote", trial_timeout_s=2.0)
    assert verdict.status is VerdictStatus.TIMEOUT, verdict
    child, grandchild = (int(p) for p in pids.read_text().split())
    assert _wait_for(lambda: _gone(child) and _gone(grandchild), 10.0)


def test_a_killed_zygote_is_restarted(tmp_path):
    assert verify(tmp_path / "a", HONEST, "zygote").ok
    first = _zygote_pid()
    os.kill(first, signal.SIGKILL)
    assert _wait_for(lambda: _gone(first))
    verdict = verify(tmp_path / "b", HONEST, "zygote")
    assert verdict.ok, verdict
    assert _zygote_pid() != first and verdict.phases_ms["child.import"] == 0.0


@pytest.fixture
def spares(monkeypatch):
    """A zygote that keeps a spare child (the environment is the zygote's: `launch` starts one)."""
    monkeypatch.setenv(zygote_server.SPARE_ENV, "1")
    yield
    zygote.shutdown()


def _spare() -> int:
    return zygote._current.spare


def test_the_spare_takes_the_next_request_and_the_next_spare_comes_when_its_child_exits(tmp_path, spares):
    first = CandidateProcess(tmp_path, launcher="zygote")
    first.start()  # starts the zygote, whose Ready names its first spare
    spare = first.process.pid
    assert _ppid(spare) == _zygote_pid() and os.getpgid(spare) == spare
    assert _spare() == 0 and zygote.spared_pids() == {_zygote_pid()}  # taken: none waits while a child runs
    first.close()
    after = _spare()
    assert after not in (0, spare) and not _gone(after) and zygote.spared_pids() == {_zygote_pid(), after}
    second = CandidateProcess(tmp_path, launcher="zygote")
    second.start()
    assert second.process.pid == after
    second.close()


def test_a_spares_child_gives_the_verdict_and_says_what_it_paid_ahead(tmp_path, spares):
    for k, (text, status) in enumerate([(HONEST, VerdictStatus.OK), (CACHING, VerdictStatus.HACK)]):
        verdict = verify(tmp_path / str(k), text, "zygote")
        assert verdict.status is status, verdict
        assert verdict.phases_ms["child.interpreter"] == 0.0 and verdict.phases_ms["child.import"] == 0.0
        assert verdict.phases_ms["child.spare_warm_up"] >= 0.0


def test_a_spare_that_died_waiting_means_a_forked_child(tmp_path, spares):
    assert verify(tmp_path / "a", HONEST, "zygote").ok  # the zygote, and a spare after the job's child
    dead = _spare()
    os.kill(dead, signal.SIGKILL)
    assert _wait_for(lambda: _gone(dead))  # a zombie of the zygote's until the next request reaps it
    child = CandidateProcess(tmp_path, launcher="zygote")
    child.start()
    try:
        assert child.process.pid != dead and _ppid(child.process.pid) == _zygote_pid()
    finally:
        child.close()
    assert _gone(dead) and _spare() not in (0, dead)
    assert verify(tmp_path / "b", HONEST, "zygote").ok


@pytest.mark.gpu
def test_a_spare_makes_its_cuda_context_ahead_and_its_child_verifies_on_the_gpu(tmp_path, spares):
    def on_gpu(name: str, text: str):
        cand = tmp_path / name / "candidate"
        cand.mkdir(parents=True)
        (cand / "model_new.py").write_text(text)
        config = VerifyConfig(allow_torch_compute=True, child_launcher="zygote")
        return run_verification(VerifyRequest(task_source=TASK, device="cuda", seed=5, config=config),
                                work_dir=tmp_path / name)

    verdicts = [on_gpu("honest", HONEST), on_gpu("caching", CACHING)]
    assert [v.status for v in verdicts] == [VerdictStatus.OK, VerdictStatus.HACK], verdicts
    assert all(v.phases_ms["child.spare_warm_up"] > 0.0 for v in verdicts)  # a context was made ahead


def test_a_zygote_that_cannot_start_means_spawn(tmp_path, monkeypatch, caplog):
    def broken(self, timeout_s=0.0):
        raise OSError("no zygote today")

    zygote.shutdown()
    monkeypatch.setattr(zygote.Zygote, "start", broken)
    child = CandidateProcess(tmp_path, launcher="zygote")
    with caplog.at_level(logging.WARNING, logger="rewards.verify.verifier"):
        child.start()
    try:
        assert isinstance(child.process, subprocess.Popen)
        assert "no zygote today" in caplog.text
    finally:
        child.close()


_ON_A_GPU = pytest.param("gpu", marks=pytest.mark.gpu)  # tests/conftest.py skips it without CUDA


@pytest.mark.parametrize("machine", ["any", _ON_A_GPU])
def test_the_zygote_starts_without_cuda_threads_or_files(tmp_path, machine):
    """The zygote's start (with the warm-up when zygote_server.WARM_UP) succeeded, which includes
    leaving no thread behind at its first fork (zygote_server._warm_up reports extra threads as its
    error); it wrote no file under TMPDIR (the empty Inductor cache dir there is made by the PRELOAD
    imports). On a GPU machine torch asks NVML whether CUDA is there, which the zygote shuts down."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"} | {"TMPDIR": str(tmp)}
    z = zygote.Zygote(sys.executable, env, str(tmp_path))
    ready = z.start()
    z.close()
    assert (ready.warm_up_error, ready.cuda_initialized) == ("", False), ready
    assert (ready.warm_up_ms > 0.0) == zygote_server.WARM_UP
    assert [p for p in tmp.rglob("*") if not p.is_dir()] == []


@pytest.mark.parametrize("machine", ["any", _ON_A_GPU])
def test_the_device_count_is_taken_in_a_child_and_answered_only_inside(machine):
    """The zygote never asks NVML or the driver itself: a forked child counts, and torch.cuda's
    questions are answered from that count inside `devices_answered` only."""
    script = """
import json, threading, torch
from rewards.queue import process_state, zygote_server as z
threads = threading.active_count()
count = process_state.count_devices_in_a_child()
own = torch.cuda.is_available, torch.cuda.device_count
with z.devices_answered(torch.cuda, count):
    inside = [torch.cuda.is_available(), torch.cuda.device_count()]
print(json.dumps({"count": count, "inside": inside, "restored": own == (torch.cuda.is_available, torch.cuda.device_count),
                  "new_threads": threading.active_count() - threads, "direct": torch.cuda.device_count()}))
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    seen = json.loads(run.stdout.splitlines()[-1])
    assert seen["count"] == seen["direct"] and (seen["count"] > 0) == (machine == "gpu")
    assert seen["inside"] == [seen["count"] > 0, seen["count"]]
    assert seen["restored"] and seen["new_threads"] == 0


def test_a_child_that_cannot_count_answers_no_devices(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1 / 0)
    assert process_state.count_devices_in_a_child() == 0


def test_the_warm_up_hashes_tritons_own_key(monkeypatch):
    """Where codecache has no triton_key wrapper, Inductor's system key calls Triton's own
    (lru-cached) one in the first compile: the warm-up computes it so that children inherit it."""
    from torch._inductor.runtime import triton_compat

    from rewards.queue import compile_warmup

    calls = []
    monkeypatch.setattr(triton_compat, "HAS_TRITON", True)
    monkeypatch.setattr(triton_compat, "triton_key", lambda: calls.append(1) or "key")
    compile_warmup.warm_up()
    assert calls


def test_a_failed_or_threaded_warm_up_is_a_message_not_a_dead_zygote(monkeypatch):
    from rewards.queue import compile_warmup

    def boom(done):
        raise RuntimeError("no compiler here\nsecond line")

    monkeypatch.setattr(compile_warmup, "warm_up", boom)
    assert zygote_server._warm_up()[1] == "RuntimeError: no compiler here"
    release = threading.Event()
    maps = []  # the fake /proc/self/maps: the driver's library once the "hashes" step loaded it

    def threaded(done):
        done("imports")
        threading.Thread(target=release.wait, name="prefetch_0").start()
        maps.append("libcuda.so.1")
        done("hashes")
        threading.Thread(target=release.wait, name="prefetch_1").start()

    monkeypatch.setattr(compile_warmup, "warm_up", threaded)
    monkeypatch.setattr(zygote_server, "mapped", lambda library: any(library in m for m in maps))
    try:
        assert zygote_server._warm_up()[1] == ("the warm-up left 2 thread(s) running (prefetch_0 after hashes, "
                                               "prefetch_1 after end); libcuda.so.1 was loaded by hashes")
    finally:
        release.set()


def test_the_zygote_leaves_nvml_as_it_found_it():
    class Nvml:
        def __init__(self, inits: int) -> None:
            self.inits = inits

        def nvmlShutdown(self) -> int:
            if self.inits == 0:
                return 1  # NVML_ERROR_UNINITIALIZED
            self.inits -= 1
            return 0

    nvml = Nvml(inits=3)
    assert process_state.release_nvml(nvml) == 3 and nvml.inits == 0
    assert process_state.release_nvml(nvml) == 0
    assert process_state.release_nvml(None) == 0


CUDA_TOUCHED = """
import sys
from rewards.queue import process_state, zygote_server

class Touched:  # the driver answers as after cuInit
    def cuDeviceGetCount(self, count):
        return 0

process_state.cuda_driver = lambda: Touched()
zygote_server.WARM_UP = {warm_up}
sys.exit(zygote_server.main(sys.argv[1:]))
"""


def _zygote_with_cuda_touched(tmp_path: Path, warm_up: bool) -> zygote_server.Ready:
    """Start a zygote whose driver probe says CUDA is touched once it has preloaded; its Ready."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    argv = [sys.executable, "-c", CUDA_TOUCHED.format(warm_up=warm_up), "--socket-fd", str(theirs.fileno()),
            "--parent-pid", str(os.getpid())]
    process = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), cwd=tmp_path, stdin=subprocess.DEVNULL)
    theirs.close()
    try:
        ours.settimeout(zygote.START_TIMEOUT_S)
        ready = zygote_server.reply_decoder.decode(ours.recv(zygote_server.MAX_MESSAGE))
        assert ready.pid == process.pid  # a restart replaces the process image, not the process
        ours.close()  # the zygote serves until its socket closes
        assert process.wait(timeout=60) == 0
        return ready
    finally:
        ours.close()
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_warm_up_that_touched_cuda_costs_a_restart_without_it(tmp_path):
    """The restarted zygote skips the warm-up, probes the real driver (none here, or untouched),
    and reports why it restarted."""
    ready = _zygote_with_cuda_touched(tmp_path, warm_up=True)
    assert (ready.cuda_initialized, ready.warm_up_ms) == (False, 0.0), ready
    assert ready.warm_up_error == zygote_server.WARM_UP_TOUCHED_CUDA


def test_cuda_touched_without_the_warm_up_is_reported_not_restarted(tmp_path):
    ready = _zygote_with_cuda_touched(tmp_path, warm_up=False)
    assert (ready.cuda_initialized, ready.warm_up_error) == (True, ""), ready


def test_the_warm_up_error_is_logged_once_per_worker(tmp_path, monkeypatch, caplog):
    def start(self, timeout_s=0.0):
        self.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        return zygote_server.Ready(pid=self.process.pid, threads=1, cuda_initialized=False,
                                   warm_up_error=zygote_server.WARM_UP_TOUCHED_CUDA)

    def fork(self, module, args, **kwargs):
        return zygote.ForkedProcess(self, 0, args)

    zygote.shutdown()
    monkeypatch.setattr(zygote, "_warm_up_errors", set())
    monkeypatch.setattr(zygote.Zygote, "start", start)
    monkeypatch.setattr(zygote.Zygote, "fork", fork)
    try:
        with caplog.at_level(logging.WARNING, logger="rewards.queue.zygote"):
            for env in ({"A": "1"}, {"A": "2"}):  # a new environment: a new zygote
                zygote.launch("rewards.verify.candidate", [], cwd=tmp_path, env=env, log_fd=1, pass_fds=())
    finally:
        zygote.shutdown()
    assert caplog.text.count(zygote_server.WARM_UP_TOUCHED_CUDA) == 1


CHILD_COMPILES = """
import os, sys
from rewards.queue.zygote_server import preload

print("warm-up error:", preload()[1] or "none", flush=True)
pid = os.fork()
if pid == 0:
    import torch
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), torch.rand(4, 8)
    with torch.no_grad():
        print("compiled equals eager:", torch.allclose(torch.compile(model)(x), model(x)), flush=True)
    os._exit(0)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_a_child_of_the_warmed_up_zygote_compiles_as_eager(tmp_path):
    """A child forked from a process prepared as the zygote prepares itself (preload: PRELOAD and
    the warm-up) compiles a module with Inductor, and the result is eager's."""
    env = dict(os.environ, TMPDIR=str(tmp_path), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    done = subprocess.run([sys.executable, "-c", CHILD_COMPILES], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["warm-up error: none", "compiled equals eager: True"], done.stdout


def test_the_zygote_forks_only_the_child_modules(tmp_path):
    z = zygote.Zygote(sys.executable, dict(os.environ), str(tmp_path))
    ready = z.start()
    try:
        assert not ready.cuda_initialized
        with open(tmp_path / "log", "wb") as log, pytest.raises(zygote.ZygoteError, match="bad request"):
            z.fork("os", [], cwd=str(tmp_path), env=dict(os.environ), log_fd=log.fileno(), pass_fds=())
        assert z.alive
    finally:
        z.close()
    assert _gone(ready.pid)


def test_profile_child_through_the_zygote_fails_the_same_way(tmp_path):
    (tmp_path / "candidate").mkdir()
    (tmp_path / "candidate" / "model_new.py").write_text("raise RuntimeError('boom at import')\n")
    request = ProfileRequest(task_source=TASK, device="cpu", config=ProfileConfig(child_launcher="zygote"))
    phases = Phases()
    timed = time_candidate(request, TimingConfig(), tmp_path, phases)
    assert not timed.ok and "boom at import" in timed.error
    assert phases.as_dict()["child.import"] == 0.0 and zygote.spared_pids()


@pytest.mark.parametrize("spare", [False, True], ids=["fork", "spare"])
def test_sandboxed_worker_keeps_its_zygote_from_job_to_job(tmp_path, spare):
    """The worker's stray reaper (bwrap pid namespace) spares the zygote: both jobs' children
    have the same parent, and the second one imported nothing. With a spare child, the spare
    forked after the first job survives the reaper and runs the second."""
    from rewards.queue.gpu_queue import GpuQueue, GpuQueueConfig

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "model_new.py").write_text(candidate("raise RuntimeError(f'parent={os.getppid()}')"))
    files, so_name = job_files(ws, None)
    config = VerifyConfig(allow_torch_compute=True, child_launcher="zygote")
    request = VerifyRequest(task_source=TASK, device="cpu", seed=5, so_path=so_name, config=config)
    queue_config = GpuQueueConfig(gpus=(0,), sandbox=True, scratch_root=str(tmp_path / "scratch"),
                                  job_default_deadline_s=300.0, env={zygote_server.SPARE_ENV: "1"} if spare else {})

    async def submit_twice():
        async with GpuQueue(queue_config) as queue:
            return [await queue.submit(Job(job_id=f"z{i}", kind="verify", payload=encode(request), files=files))
                    for i in range(2)]

    verdicts = [verdict_from_job(r.status, r.value, r.error) for r in anyio.run(submit_twice)]
    parents = [v.message.split("parent=")[1].split()[0] for v in verdicts]
    assert all(v.status is VerdictStatus.RUNTIME_ERROR for v in verdicts), verdicts
    assert parents[0] == parents[1]
    assert verdicts[1].phases_ms["child.import"] == 0.0
    assert ("child.spare_warm_up" in verdicts[1].phases_ms) == spare
