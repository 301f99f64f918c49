"""Whatever a candidate does is a verdict with its cause, never an infrastructure error: the
verify handler once raised (`verify job failed ... run_inline`) when the candidate's run left the
verifier's own steps failing. Here, on the CPU with a real candidate child: a candidate that
wrecks the transfer dir it shares, the verifier running out of memory or failing to judge the
outputs after the candidate ran (faked at the step where it happens), and the GPU worker's
scratch dir removed by a job. A CUDA error of the verifier's own process still raises: that is
the machine. The single-file path's share (unreadable files, nesting past the parser or the
static checks) is in tests/test_inline.py."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
import torch

from rewards.queue.jobs import Job, JobContext, JobStatus, encode
from rewards.queue.worker import Worker, _failed
from rewards.verdict import VerdictStatus as S
from rewards.verify.judge import Judge
from rewards.verify.trials import Verification, candidate_caused
from rewards.verify.verifier import VerifyConfig, VerifyRequest, run_verification

TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(16))

    def forward(self, x):
        return torch.relu(x * self.scale)

def get_inputs():
    return [torch.rand(8, 16)]

def get_init_inputs():
    return []
"""

HONEST_TORCH = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(16))

    def forward(self, x):
        return torch.relu(x * self.scale)
"""

# Replaces the state_dict blob the verifier wrote with a directory: the child's load fails, and
# the verifier's clean-up of the blob met the directory (IsADirectoryError, once an infra error).
WRECKS_TRANSFER = """
import glob
import os
for transfer in glob.glob("{work_dir}/xfer-*"):
    os.remove(os.path.join(transfer, "state.bin"))
    os.mkdir(os.path.join(transfer, "state.bin"))
""" + HONEST_TORCH


def verify(child, tmp_path: Path, text: str):
    cand = tmp_path / "cand"
    cand.mkdir(exist_ok=True)
    (cand / "model_new.py").write_text(text)
    config = VerifyConfig(allow_torch_compute=True)
    request = VerifyRequest(task_source=TASK, device="cpu", seed=3, candidate_dir=str(cand), config=config)
    return run_verification(request, work_dir=tmp_path, process=child)


def test_a_candidate_that_wrecks_the_transfer_dir_gets_a_verdict(child, tmp_path):
    verdict = verify(child, tmp_path, WRECKS_TRANSFER.replace("{work_dir}", str(tmp_path)))
    assert verdict.status is S.RUNTIME_ERROR and "ModelNew could not be built" in verdict.message


def test_running_out_of_memory_after_the_candidate_ran_is_its_verdict(child, tmp_path, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(Verification, "_float64", out_of_memory)
    verdict = verify(child, tmp_path, HONEST_TORCH)
    assert verdict.status is S.RUNTIME_ERROR
    assert "after the candidate ran: OutOfMemoryError: CUDA out of memory" in verdict.message


def test_outputs_the_judge_cannot_read_are_a_verdict_naming_the_exception(child, tmp_path, monkeypatch):
    def unreadable(*args, **kwargs):
        raise TypeError("cannot compare a tensor of dtype torch.float8_e8m0fnu")

    monkeypatch.setattr(Judge, "outputs", unreadable)
    verdict = verify(child, tmp_path, HONEST_TORCH)
    assert verdict.status is S.RUNTIME_ERROR and "TypeError: cannot compare" in verdict.message


def test_a_cuda_error_of_the_verifier_itself_is_the_machine_and_raises(child, tmp_path, monkeypatch):
    def machine(*args, **kwargs):
        raise RuntimeError("CUDA error: uncorrectable ECC error encountered")

    monkeypatch.setattr(Verification, "_float64", machine)
    with pytest.raises(RuntimeError, match="ECC"):
        verify(child, tmp_path, HONEST_TORCH)
    assert not candidate_caused(RuntimeError("CUDA error: unspecified launch failure"))
    assert candidate_caused(RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))


# -- the GPU worker ---------------------------------------------------------------------------------


def remove_scratch(payload: bytes, ctx: JobContext) -> bytes:
    """A job handler that removes its own scratch dir, as a candidate in that dir can."""
    shutil.rmtree(ctx.scratch_dir)
    return b"removed"


def answer(payload: bytes, ctx: JobContext) -> bytes:
    return (Path(ctx.scratch_dir) / "input.txt").read_bytes()


def test_a_job_that_removes_its_scratch_dir_leaves_the_next_job_a_fresh_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the worker changes into its scratch dir
    handlers = {"remove": f"{__name__}:remove_scratch", "answer": f"{__name__}:answer"}
    args = argparse.Namespace(gpu=0, scratch=str(tmp_path / "scratch"), fork_per_job=False,
                              handlers=json.dumps(handlers), reap_strays=False)
    (tmp_path / "scratch").mkdir()
    worker = Worker(args, channel=None)
    assert worker.run(Job(job_id="1", kind="remove")).status is JobStatus.OK
    result = worker.run(Job(job_id="2", kind="answer", files={"input.txt": b"42"}))
    assert (result.status, result.value) == (JobStatus.OK, b"42")


def test_an_error_whose_text_is_not_utf8_still_makes_a_result():
    result = _failed(Job(job_id="1", kind="verify"), JobStatus.ERROR, OSError(2, "No such file", "out-\udcff.bin"))
    assert "\\udcff" in result.error
    assert encode(result)
