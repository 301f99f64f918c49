"""The rft probe's judging (bench.system.rft_probe): teachers build and are right, a wrong `apply`
expression or a launcher the binding declares otherwise is caught, and the training samples stop
after the write turn. nvcc and g++ do the judging; no GPU, no model."""

from __future__ import annotations

import shutil

import pytest

from agentcore.chat import ChatRenderer
from agentcore.tiny_tokenizer import load_tokenizer
from agentcore.toolparse import tool_schemas
from bench.system.rft_probe import (
    judge,
    links,
    teacher_trajectories,
    write_turn_sample,
    written_files,
)
from rl.data import families as fam
from rl.demonstrations import DemoTask

needs_compiler = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("g++") is None, reason="needs nvcc")
SILU_SMOKE = "(v > 255.0 ? v : (v / 255.0)) * 25.0"  # what the smoke's policy wrote for silu


@pytest.fixture(scope="module")
def heldout() -> dict[str, DemoTask]:
    return {d.task.task_id: d for d in fam.family_demos(fam.split(scale=0.01).heldout)}


def _cu(files: dict[str, str]) -> str:
    (key,) = [k for k in files if k.endswith(".cu")]
    return key


@needs_compiler
@pytest.mark.parametrize("task_id", ["fam_unary_silu_s3", "fam_binary_min_row_s1",
                                     "fam_chain_leaky_relu_silu_tanh_hardsigmoid_s2", "fam_norm_layernorm_s1"])
def test_a_teacher_builds_and_is_right(heldout, task_id):
    d = heldout[task_id]
    assert judge(d.task, d.files, d.files) == (True, True, "")


@needs_compiler
def test_a_wrong_apply_expression_builds_but_is_wrong(heldout):
    d = heldout["fam_unary_silu_s3"]
    files = dict(d.files)
    files[_cu(files)] = files[_cu(files)].replace(fam.UNARY["silu"].cuda, SILU_SMOKE)
    builds, right, why = judge(d.task, files, d.files)
    assert builds and not right and "apply differs" in why


@needs_compiler
def test_an_equivalent_expression_other_than_the_teachers_is_right(heldout):
    d = heldout["fam_unary_relu_s3"]
    files = dict(d.files)
    files[_cu(files)] = files[_cu(files)].replace("fmaxf(v, 0.0f)", "(v > 0.0f ? v : 0.0f)")
    assert judge(d.task, files, d.files) == (True, True, "")


def test_a_launcher_declared_with_other_parameters_does_not_link(heldout):
    d = heldout["fam_binary_add_row_s3"]
    files = dict(d.files)
    assert links(files, "binary") == ""
    files["kernels/binary_binding.cpp"] = files["kernels/binary_binding.cpp"].replace(
        "long long n, long long cols, cudaStream_t", "long long n, cudaStream_t")
    assert "binary_launcher" in links(files, "binary")


def test_a_row_kernel_other_than_the_teachers_is_wrong(heldout):
    d = heldout["fam_reduce_min_s0"]
    files = dict(d.files)
    files[_cu(files)] = files[_cu(files)].replace("fminf(acc, v)", "fmaxf(acc, v)")
    _, right, why = judge(d.task, files, d.files)
    assert not right and "differs from the teacher's" in why


def test_the_sample_ends_with_the_write_turn_whose_files_are_the_teachers(tiny_tokenizer_dir, heldout):
    renderer = ChatRenderer(load_tokenizer(tiny_tokenizer_dir), tool_schemas(), "hermes")
    d = heldout["fam_unary_mish_s1"]
    (traj,) = teacher_trajectories([d], renderer)
    sample = write_turn_sample(traj)
    write = traj.turns[1]
    assert len(sample.token_ids) == len(traj.prompt_ids) + write.gen_end
    assert sample.action_mask[-1] == 1 and sum(sample.action_mask) == traj.turns[0].gen_end + write.gen_end - write.gen_start
    assert written_files(renderer, traj.response_ids[write.gen_start:write.gen_end]) == d.files
