"""Where a verify or profile job's time goes (the target: each job under 3 s): the phases a job's
result carries, on the CPU path of verification (a real queue worker, a real candidate child,
device "cpu") and of the profile child, and the bench report's aggregation of them.

One property per test; the clock is never asserted against a limit, only the bookkeeping: the
named phases are there, none is negative, and the trusted side's disjoint phases fit inside the
handler's run time.
"""

from __future__ import annotations

import os
import time

import anyio
import msgspec
import pytest

from bench.system.gpu_queue_real import JobRecord, job_phases, phase_summary
from rewards.queue.jobs import Job, JobResult, JobStatus, decode, encode
from rewards.timing.profile import Profile, ProfileRequest, Timed, time_candidate
from rewards.timing.sampling import TimingConfig
from rewards.verdict import Verdict, VerdictStatus
from rewards.verify.phases import CHILD, Phases, process_age_ms, top_level_ms
from rewards.verify.verifier import (
    CandidateProcess,
    VerifyConfig,
    VerifyRequest,
    job_files,
    run_verification,
    verdict_from_job,
)
from rewards.verify.wire import Loaded, TrialReport, child_decoder

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

CANDIDATE = """
import torch
import torch.nn as nn
import torch.nn.functional as F

class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.relu(F.linear(x, self.linear.weight, self.linear.bias))
"""

TRUSTED_PHASES = {"import", "spawn", "setup", "model", "load", "trial.inputs", "trial.reference", "trial.fp64",
                  "trial.candidate", "trial.observe", "trial.outputs", "trial.judge", "verdict", "close"}
CHILD_PHASES = {"child.interpreter", "child.import", "child.warm_up", "child.snapshot", "child.build",
                "child.trial.inputs", "child.trial.poison", "child.trial.forward", "child.trial.probes",
                "child.trial.send_outputs"}


@pytest.fixture(scope="module")
def verify_job(tmp_path_factory) -> tuple[JobResult, Verdict]:
    """One CPU verify job through a real queue worker: its JobResult and decoded Verdict."""
    from rewards.queue.gpu_queue import GpuQueue, GpuQueueConfig

    root = tmp_path_factory.mktemp("phases")
    (root / "ws").mkdir()
    (root / "ws" / "model_new.py").write_text(CANDIDATE)
    files, so_name = job_files(root / "ws", None)
    request = VerifyRequest(task_source=TASK, device="cpu", seed=5, so_path=so_name,
                            config=VerifyConfig(allow_torch_compute=True))
    job = Job(job_id="phases-verify", kind="verify", payload=encode(request), files=files, deadline_s=300.0)
    config = GpuQueueConfig(gpus=(0,), scratch_root=str(root / "scratch"), job_default_deadline_s=300.0)

    async def submit() -> JobResult:
        async with GpuQueue(config) as queue:
            return await queue.submit(job)

    result = anyio.run(submit)
    return result, verdict_from_job(result.status, result.value, result.error)


def test_verify_verdict_names_every_trusted_and_child_phase(verify_job):
    result, verdict = verify_job
    assert result.status is JobStatus.OK and verdict.status is VerdictStatus.OK, verdict.message
    assert TRUSTED_PHASES <= set(verdict.phases_ms), sorted(verdict.phases_ms)
    assert CHILD_PHASES <= set(verdict.phases_ms), sorted(verdict.phases_ms)
    assert all(ms >= 0.0 for ms in verdict.phases_ms.values()), verdict.phases_ms


def test_verify_trusted_phases_fit_in_the_handlers_run_time(verify_job):
    result, verdict = verify_job
    assert 0.0 < top_level_ms(verdict.phases_ms) <= 1e3 * result.run_s


def test_child_startup_is_inside_the_parents_wait_for_the_load(verify_job):
    """The child's import and warm-up run while the parent sets up and waits for Loaded (import is
    zero under the default zygote launcher, which imported everything once)."""
    _, v = verify_job
    p = v.phases_ms
    assert p["child.import"] >= 0.0 and p["child.warm_up"] > 0.0
    assert p["child.warm_up"] + p["child.build"] <= p["load"]
    assert p["child.trial.forward"] <= p["trial.candidate"]


def test_close_kills_the_child_and_its_group_at_once(tmp_path):
    child = CandidateProcess(tmp_path)
    child.start()
    pid = child.process.pid
    child.close()
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    assert child.process is None and not child.alive


def test_no_candidate_code_runs_after_the_verdict(tmp_path):
    """close() kills instead of asking the child to exit: its atexit handlers never run (and the
    job does not wait for the child's torch and CUDA teardown)."""
    marker = tmp_path / "atexit-ran"
    prelude = f"import atexit\natexit.register(lambda: open({str(marker)!r}, 'w').close())\n"
    (tmp_path / "candidate").mkdir()
    (tmp_path / "candidate" / "model_new.py").write_text(prelude + CANDIDATE)
    request = VerifyRequest(task_source=TASK, device="cpu", seed=5, config=VerifyConfig(allow_torch_compute=True))
    verdict = run_verification(request, work_dir=tmp_path)
    assert verdict.ok, verdict.message
    assert verdict.phases_ms["close"] >= 0.0
    assert not marker.exists()


def test_profile_child_phases_come_back_with_a_failed_build(tmp_path):
    (tmp_path / "candidate").mkdir()
    (tmp_path / "candidate" / "model_new.py").write_text("raise RuntimeError('boom at import')\n")
    phases = Phases()
    start = time.perf_counter()
    timed = time_candidate(ProfileRequest(task_source=TASK, device="cpu"), TimingConfig(), tmp_path, phases)
    elapsed_ms = 1e3 * (time.perf_counter() - start)
    assert not timed.ok and "boom at import" in timed.error
    got = phases.as_dict()
    assert {"state", "spawn", "child", "close", "child.interpreter", "child.import", "child.build"} <= set(got)
    assert top_level_ms(got) <= elapsed_ms
    assert got["child.build"] <= got["child"]


def test_payloads_without_phases_still_decode():
    """Verdicts, Profiles and child reports encoded before the field existed decode with {}."""
    old_verdict = msgspec.msgpack.encode({"status": "ok", "trials": 5})
    old_profile = msgspec.msgpack.encode({"ok": True})
    old_loaded = msgspec.msgpack.encode({"msg": "loaded", "ok": True})
    old_report = msgspec.msgpack.encode({"msg": "report", "index": 0, "run": 0, "ok": True})
    assert decode(old_verdict, Verdict).phases_ms == {}
    assert decode(old_profile, Profile).phases_ms == {} and decode(encode({"ok": False}), Timed).phases_ms == {}
    loaded, report = child_decoder.decode(old_loaded), child_decoder.decode(old_report)
    assert isinstance(loaded, Loaded) and isinstance(report, TrialReport)
    assert loaded.phases_ms == {} and report.phases_ms == {}


def test_phases_add_up_repeated_names_and_prefix_a_childs_account():
    synced = []
    phases = Phases(sync=lambda: synced.append(True))
    for _ in range(2):
        with phases.phase("trial.reference", sync=True):
            pass
    with phases.phase("setup"):
        pass
    phases.merge({"import": 5.0, "trial.forward": 1.0})
    phases.merge({"trial.forward": 2.0})
    got = phases.as_dict()
    assert synced == [True, True]
    assert got["child.import"] == 5.0 and got["child.trial.forward"] == 3.0
    assert top_level_ms(got) == pytest.approx(got["trial.reference"] + got["setup"])
    assert all(not name.startswith(CHILD) or name in ("child.import", "child.trial.forward") for name in got)


def test_process_age_counts_the_time_before_our_code_ran():
    assert process_age_ms() > 0.0


def _record(kind: str, run_s: float, wall_s: float, phases: dict[str, float]) -> JobRecord:
    result = JobResult(job_id="j", status=JobStatus.OK, run_s=run_s, wall_s=wall_s)
    return JobRecord(kind=kind, demo="d", ok=True, status="ok", run_s=run_s, wall_s=wall_s,
                     phases_ms=job_phases(result, phases))


def test_bench_job_phases_add_the_queue_and_the_unaccounted_time():
    record = _record("verify", 1.0, 1.25, {"load": 600.0, "close": 100.0, "child.import": 500.0})
    assert record.phases_ms["queue.outside_handler"] == pytest.approx(250.0)
    assert record.phases_ms["handler.unaccounted"] == pytest.approx(300.0)  # 1000 - (600 + 100)
    assert job_phases(JobResult(job_id="j", status=JobStatus.ERROR), {}) == {}


def test_bench_phase_summary_is_mean_p50_max_per_phase_largest_first():
    records = [_record("verify", 1.0, 1.0, {"load": ms, "close": 10.0}) for ms in (100.0, 300.0, 200.0)]
    records.append(_record("verify", 1.0, 1.0, {"close": 40.0}))  # a job without "load"
    got = phase_summary(records)
    assert got["load"] == {"mean": pytest.approx(200.0), "p50": 200.0, "max": 300.0, "jobs": 3}
    assert got["close"]["max"] == 40.0 and got["close"]["jobs"] == 4
    assert list(got)[0] == "handler.unaccounted"  # 1000 ms minus the phases: the largest here
    assert phase_summary([]) == {}


def test_bench_summary_reports_phases_per_kind():
    from bench.system.gpu_queue_real import summarize

    records = [_record("verify", 1.0, 1.0, {"load": 100.0}), _record("profile", 1.0, 1.0, {"child": 50.0})]
    kinds = summarize(records)["kinds"]
    assert "load" in kinds["verify"]["phases_ms"] and "load" not in kinds["profile"]["phases_ms"]
    assert kinds["profile"]["phases_ms"]["child"]["mean"] == pytest.approx(50.0)


def test_the_parts_of_a_phase_are_not_added_again():
    got = {"load": 2.0, "trial.judge": 10.0, "trial.judge.queue": 5.0, "trial.judge.read": 4.0, "child.load": 7.0,
           "trial.inputs": 1.0}
    assert top_level_ms(got) == 13.0
