"""rl.data.hf_seeds: transformers modules inlined as plain torch. Each inlined module computes what
the installed transformers class computes (built from a tiny config, no downloads); rendered
tasks are self-contained, run on CPU, record their provenance, chain with the torch seeds and go
through decontamination like any other task."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from agentcore.tasks import check_source
from agentcore.types import Task
from rl.data.compose import Config, compose_many
from rl.data.hf_seeds import hf_table
from rl.data.seeds import build, seed_ops, seed_task
from rl.data.similarity import build_corpus, decontaminate

SCALE = 0.02
HF = {op.name.removeprefix("transformers."): op for op in hf_table()}


def _exec(source: str) -> types.ModuleType:
    module = types.ModuleType("generated")
    exec(compile(source, "model.py", "exec"), module.__dict__)
    return module


def _ours(name: str, shape):
    torch.manual_seed(0)
    return build(HF[name], shape)


def test_every_transformers_seed_is_in_the_seed_table():
    names = {op.name for op in seed_ops()}
    assert {f"transformers.{n}" for n in HF} <= names
    assert not {op.name for op in seed_ops(transformers=False)} & {f"transformers.{n}" for n in HF}


@pytest.mark.parametrize("name", sorted(HF))
def test_seed_source_is_self_contained_and_runs_on_cpu(name, monkeypatch):
    task = seed_task(HF[name], scale=SCALE)
    assert check_source(task.source) is None
    assert "import transformers" not in task.source and "from transformers" not in task.source
    monkeypatch.setitem(sys.modules, "transformers", None)  # the verify worker need not have it
    module = _exec(task.source)
    with torch.no_grad():
        out = module.Model(*module.get_init_inputs())(*module.get_inputs())
    assert out.numel() > 0 and torch.isfinite(out).all()
    assert task.metadata["transformers"] == HF[name].origin


# ---------------------------------------------------------------------------------------------
# The inlined math against the installed transformers classes.


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["NewGELUActivation", "FastGELUActivation", "QuickGELUActivation",
                                  "AccurateGELUActivation", "LaplaceActivation", "ReLUSquaredActivation"])
def test_activation_matches_transformers(tf, name):
    from transformers import activations

    x = torch.randn(4, 64) * 3
    torch.testing.assert_close(_ours(name, (4, 64))(x), getattr(activations, name)()(x))


@pytest.mark.parametrize("name", ["LlamaRMSNorm", "GemmaRMSNorm"])
def test_rmsnorm_matches_transformers(tf, name):
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    theirs = {"LlamaRMSNorm": LlamaRMSNorm, "GemmaRMSNorm": GemmaRMSNorm}[name](32)
    torch.nn.init.normal_(theirs.weight)
    ours = _ours(name, (4, 32))
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(4, 7, 32)
    torch.testing.assert_close(ours(x), theirs(x))


def test_llama_mlp_matches_transformers(tf):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    theirs = LlamaMLP(LlamaConfig(hidden_size=32, intermediate_size=64, hidden_act="silu", mlp_bias=False))
    ours = _ours("LlamaMLP", (4, 32))
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 5, 32)
    torch.testing.assert_close(ours(x), theirs(x))


def test_gpt2_mlp_matches_transformers(tf):
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

    theirs = GPT2MLP(128, GPT2Config(n_embd=32, activation_function="gelu_new", resid_pdrop=0.0)).eval()
    for p in theirs.parameters():
        torch.nn.init.normal_(p, std=0.1)
    ours = _ours("GPT2MLP", (4, 32))
    ours.load_state_dict({k.replace(".", "_"): v for k, v in theirs.state_dict().items()})
    x = torch.randn(3, 5, 32)
    torch.testing.assert_close(ours(x), theirs(x))


def _llama_rope(config, x, seq_len):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    position_ids = torch.arange(seq_len)[None].expand(x.shape[0], seq_len)
    return LlamaRotaryEmbedding(config)(x, position_ids)


def test_rotary_matches_transformers(tf):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=64, num_attention_heads=4)  # head_dim 16
    q = torch.randn(2, 4, 9, 16)  # [batch, heads, seq, head_dim]
    cos, sin = _llama_rope(config, q, 9)
    theirs, _ = apply_rotary_pos_emb(q, q, cos, sin)
    torch.testing.assert_close(_ours("LlamaRotaryEmbedding", (2, 4, 9, 16))(q), theirs)


def test_attention_matches_transformers(tf):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    # our LlamaAttention(256): 4 heads of 64, one key/value head per 4 query heads
    config = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=1, attn_implementation="eager")
    theirs = LlamaAttention(config, layer_idx=0).eval()
    ours = _ours("LlamaAttention", (2, 6, 256))
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 6, 256)
    causal = torch.full((6, 6), float("-inf")).triu(1)[None, None].expand(2, 1, 6, 6)
    expected, _ = theirs(x, position_embeddings=_llama_rope(config, x, 6), attention_mask=causal)
    torch.testing.assert_close(ours(x), expected)


# ---------------------------------------------------------------------------------------------
# Composition and decontamination.


@pytest.fixture(scope="module")
def mixed():
    tasks = compose_many(80, config=Config(scale=SCALE))
    return [t for t in tasks if "transformers" in t.metadata]


def test_transformers_seeds_chain_with_torch_seeds(mixed):
    both = [t for t in mixed if any(not n.startswith("transformers.") for n in t.metadata["ops"].split(","))]
    assert both, [t.metadata["ops"] for t in mixed]
    for task in mixed:
        module = _exec(task.source)
        with torch.no_grad():
            out = module.Model(*module.get_init_inputs())(*module.get_inputs())
        assert out.numel() > 0, task.metadata["ops"]
        hf_ops = [n for n in task.metadata["ops"].split(",") if n.startswith("transformers.")]
        assert task.metadata["transformers"].split(",") == [HF[n.removeprefix("transformers.")].origin for n in hf_ops]


def test_a_transformers_task_is_decontaminated_like_any_other(mixed):
    task = mixed[0]
    resized = seed_task(HF["LlamaMLP"], scale=SCALE)
    copy = seed_task(HF["LlamaMLP"], scale=2 * SCALE)  # the same module at other sizes
    corpus = build_corpus([Task(task_id="L3/copy", source=copy.source), Task(task_id="L1/relu", source=seed_task(
        next(op for op in seed_ops() if op.name == "nn.ReLU"), scale=SCALE).source)])
    kept, dropped = decontaminate([task, resized], corpus, threshold=0.9)
    assert resized.task_id in [d.task_id for d in dropped]
    assert all(d.similarity > 0.9 for d in dropped)
    assert all("kernelbench_similarity" in t.metadata for t in kept)
