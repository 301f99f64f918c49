"""rl.data.similarity: structural similarity to KernelBench, operator signatures, decontamination."""

from __future__ import annotations

import pytest

from agentcore.types import Task
from rl.data.kernelbench import PROBLEMS
from rl.data.similarity import build_corpus, decontaminate, nearest, operator_signature, similarity

KERNELBENCH = PROBLEMS

CONV_RELU = """import torch
import torch.nn as nn

class Model(nn.Module):
    \"\"\"Conv then ReLU then a bias.\"\"\"
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv(x)
        x = torch.relu(x)
        x = x + self.bias
        return x

batch_size = 128
in_channels = 3
out_channels = 16
height = width = 32
kernel_size = 3
bias_shape = (out_channels, 1, 1)

def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape]
"""

RENAMED_RESIZED = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, cin, cout, k, bshape):
        super(Model, self).__init__()
        self.c1 = nn.Conv2d(cin, cout, k)
        self.b = nn.Parameter(torch.randn(bshape))

    def forward(self, inp):
        inp = self.c1(inp)
        inp = torch.relu(inp)
        inp = inp + self.b
        return inp

n = 7
ci = 64
co = 9
h = w = 512
ks = 5
bs = (co, 1, 1)

def get_inputs():
    return [torch.randn(n, ci, h, w)]

def get_init_inputs():
    return [ci, co, ks, bs]
"""

SOFTMAX = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)

batch_size = 4096
dim = 393216

def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]

def get_init_inputs():
    return []
"""


def test_renamed_and_resized_copy_scores_one():
    assert similarity(CONV_RELU, RENAMED_RESIZED) == pytest.approx(1.0)


def test_a_conv_and_a_softmax_score_low():
    assert similarity(CONV_RELU, SOFTMAX) < 0.5


def test_torch_api_names_are_not_normalised_away():
    assert similarity(SOFTMAX, SOFTMAX.replace("torch.softmax", "torch.log_softmax")) < 1.0


def test_operator_signature_follows_forward_order_through_submodules():
    assert operator_signature(CONV_RELU) == ("torch.nn.Conv2d", "torch.relu", "Add")
    assert operator_signature(RENAMED_RESIZED) == operator_signature(CONV_RELU)
    assert operator_signature(SOFTMAX) == ("torch.softmax",)


def test_nearest_finds_the_closest_problem():
    corpus = build_corpus([Task(task_id="softmax", source=SOFTMAX), Task(task_id="conv", source=CONV_RELU)])
    assert nearest(RENAMED_RESIZED, corpus) == ("conv", pytest.approx(1.0))


def test_decontaminate_respects_the_threshold():
    corpus = [Task(task_id="conv", source=CONV_RELU)]
    candidate = Task(task_id="cand", source=SOFTMAX)
    score = similarity(SOFTMAX, CONV_RELU)
    kept, dropped = decontaminate([candidate], corpus, threshold=score - 0.01)
    assert not kept and dropped[0].reason == "similarity" and dropped[0].nearest_id == "conv"
    kept, dropped = decontaminate([candidate], corpus, threshold=score + 0.01)
    assert [t.task_id for t in kept] == ["cand"] and not dropped
    assert kept[0].metadata["nearest_kernelbench"] == "conv"


def test_signature_match_is_reported_and_dropped_only_on_request():
    corpus = [Task(task_id="conv", source=CONV_RELU)]
    kept, _ = decontaminate([Task(task_id="c", source=RENAMED_RESIZED)], corpus, threshold=1.01)
    assert kept[0].metadata["signature_match"] == "conv"
    kept, dropped = decontaminate([Task(task_id="c", source=RENAMED_RESIZED)], corpus, threshold=1.01, drop_signature_matches=True)
    assert not kept and dropped[0].reason == "signature"


def test_kernelbench_conv_and_softmax_problems_are_far_apart_and_self_match():
    from rl.data.loaders import load_kernelbench

    by_id = {t.task_id: t for t in load_kernelbench(KERNELBENCH, levels={1, 2}).tasks}
    softmax, conv = by_id["L1/23_Softmax"].source, by_id["L2/1_Conv2D_ReLU_BiasAdd"].source
    assert similarity(softmax, conv) < 0.5
    corpus = build_corpus(by_id.values())
    assert nearest(conv, corpus) == ("L2/1_Conv2D_ReLU_BiasAdd", pytest.approx(1.0))
