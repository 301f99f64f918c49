"""rl.data.seeds and rl.data.compose: generated sources exec and run forward on CPU at small scale."""

from __future__ import annotations

import types

import pytest
import torch

from agentcore.tasks import check_source
from rl.data.compose import Config, compose, compose_many
from rl.data.loaders import check_runs
from rl.data.seeds import base_shape, seed_ops, seed_task

SCALE = 0.02


def _run(source: str) -> torch.Tensor:
    module = types.ModuleType("generated")
    exec(compile(source, "model.py", "exec"), module.__dict__)
    model = module.Model(*module.get_init_inputs())
    with torch.no_grad():
        return model(*module.get_inputs())


def test_seed_table_covers_every_family():
    families = {op.family for op in seed_ops()}
    assert {"conv", "pooling", "norm", "activation", "linear", "elementwise", "reduction"} <= families


@pytest.mark.parametrize("name", ["nn.Conv2d", "nn.MaxPool3d", "nn.GroupNorm", "nn.Linear", "nn.GELU", "torch.logsumexp"])
def test_seed_source_runs_at_small_scale(name):
    op = next(op for op in seed_ops() if op.name == name)
    task = seed_task(op, scale=SCALE)
    assert check_source(task.source) is None
    out = _run(task.source)
    assert isinstance(out, torch.Tensor) and out.numel() > 0


def test_every_seed_runs_at_small_scale():
    for op in seed_ops():
        out = _run(seed_task(op, scale=SCALE).source)
        assert torch.isfinite(out).any(), op.name


def test_scale_one_aims_at_2_to_the_27_elements():
    for rank in (2, 3, 4, 5):
        numel = torch.Size(base_shape(rank)).numel()
        assert 2**26 <= numel <= 2**28


def test_fifty_compositions_exec_and_run_forward():
    tasks = compose_many(50, config=Config(scale=SCALE))
    assert len({t.source for t in tasks}) > 40
    for task in tasks:
        assert check_source(task.source) is None
        out = _run(task.source)
        assert isinstance(out, torch.Tensor) and out.numel() > 0, task.metadata["ops"]
        assert 1 <= task.metadata["depth"] <= 5
        assert len(task.metadata["ops"].split(",")) == task.metadata["depth"]


def test_same_seed_gives_the_same_source():
    assert compose(11, config=Config(scale=SCALE)).source == compose(11, config=Config(scale=SCALE)).source
    assert compose(11, config=Config(scale=SCALE)).source != compose(12, config=Config(scale=SCALE)).source


def test_max_depth_is_respected():
    for task in compose_many(20, config=Config(scale=SCALE, max_depth=2)):
        assert task.metadata["depth"] <= 2


def test_a_composition_runs_in_a_child_process():
    assert check_runs(compose(3, config=Config(scale=SCALE)), timeout_s=60) is None
