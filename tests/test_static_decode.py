"""The embedded engine's static decode path (`rl.engine.static_decode`) against its dynamic one.

On the CPU the fixed-shape step runs eagerly: the same tokens and log-probs as transformers' own
forward, rows joining and leaving, both model families it supports. The GPU test replays the steps
as CUDA graphs."""

from __future__ import annotations

from typing import Any

import pytest

from agentcore.tiny_tokenizer import load_tokenizer
from rl.engine.static_decode import supports
from tests.test_embedded_engine import GREEDY, full_forward_logprobs, gather, late_join, make_engine, params


def _llama(vocab: int) -> dict[str, Any]:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=64, max_position_embeddings=1024,
                       tie_word_embeddings=True).to_dict()


def _qwen2(vocab: int) -> dict[str, Any]:
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=64, max_position_embeddings=1024).to_dict()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def family(request, tiny_tokenizer_dir) -> dict[str, Any]:
    vocab = len(load_tokenizer(tiny_tokenizer_dir))
    return (_llama if request.param == "llama" else _qwen2)(vocab)


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer_dir) -> list[list[int]]:
    tok = load_tokenizer(tiny_tokenizer_dir)
    texts = ["Write a relu kernel.", "a", "Profile the softmax kernel against eager PyTorch now.",
             '<tool_call>\n{"name": "compile"}', "verify", "The kernel compiles; now time it please."]
    return [tok.encode(t) for t in texts]


async def test_static_greedy_decoding_equals_the_dynamic_path(family, prompts):
    # Budgets apart: rows leave at different steps, so static chunks end early and resume.
    jobs = [(p, params(n, **GREEDY)) for p, n in zip(prompts, (12, 40, 5, 16, 33, 21))]
    dynamic, static = make_engine(family), make_engine(family, static_decode=True, decode_chunk_steps=8)
    static.model.load_state_dict(dynamic.model.state_dict())
    async with dynamic.running():
        want = await gather(dynamic, jobs)
    async with static.running():
        got = await gather(static, jobs)
    for a, b in zip(want, got, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    counts = static.runner.counts
    assert counts["static_steps"] > counts["steps"] // 2  # most steps went through the fixed-shape path
    assert static.runner.static is not None and static.runner.static.captures == 0  # no graphs on a CPU


@pytest.mark.parametrize("where", ["step", "begin"])
async def test_a_failing_static_path_turns_itself_off_and_the_batch_goes_on(family, prompts, monkeypatch, where):
    """A capture that fails on a GPU (the edge faked here) costs the engine its static path, not
    the requests: each gets the tokens the dynamic path gives it."""
    from rl.engine.static_decode import StaticDecoder

    jobs = [(p, params(n, **GREEDY)) for p, n in zip(prompts, (12, 40, 5, 16, 33, 21))]
    dynamic, static = make_engine(family), make_engine(family, static_decode=True, decode_chunk_steps=8)
    static.model.load_state_dict(dynamic.model.state_dict())
    calls = {"n": 0}
    real = getattr(StaticDecoder, where)

    def fails_on_the_third(self, *args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("it->second->use_count > 0 INTERNAL ASSERT FAILED (faked)")
        return real(self, *args)

    monkeypatch.setattr(StaticDecoder, where, fails_on_the_third)
    async with dynamic.running():
        want = await gather(dynamic, jobs)
    async with static.running():
        got = await gather(static, jobs)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    for a, b in zip(want, got, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    counts = static.runner.counts
    assert counts["static_failures"] == 1 and static.runner.static is None
    assert calls["n"] == 3


async def test_static_sampled_logprobs_equal_a_full_forward_pass(family, prompts):
    engine = make_engine(family, static_decode=True)
    jobs = [(p, params(24, temperature=t, seed=i)) for i, (p, t) in enumerate(zip(prompts, (1.0, 0.7, 1.3, 1.0)))]
    async with engine.running():
        gens = await gather(engine, jobs)
    for (prompt, ps), gen in zip(jobs, gens, strict=True):
        assert gen.logprobs == pytest.approx(full_forward_logprobs(engine, prompt, gen.token_ids, ps.temperature),
                                             abs=1e-4)
    assert engine.runner.counts["static_steps"] > 0


async def test_a_request_joining_a_static_batch_gets_the_tokens_it_gets_alone(family, prompts):
    long_job, late_job = (prompts[1], params(60, **GREEDY)), (prompts[2], params(9, **GREEDY))
    engine = make_engine(family, static_decode=True, decode_chunk_steps=4)
    alone, first, late = await late_join(engine, long_job, late_job, 10)
    assert engine.statistics().max_batch_size == 2 and engine.runner.counts["static_steps"] > 0
    assert [first, late] == alone


async def test_releasing_memory_drops_the_static_buffers(family, prompts):
    engine = make_engine(family, static_decode=True)
    async with engine.running():
        await engine.generate(prompts[0], params(10, **GREEDY), session_id="a")
        assert engine.runner.static.keys  # the buffers of the shape it decoded at
        await engine.release_memory(["kv_cache"])
        assert not engine.runner.static.keys and not engine.runner.static.shapes
        await engine.resume_memory()
        again = await engine.generate(prompts[0], params(10, **GREEDY), session_id="b")
    assert len(again.token_ids) == 10


def test_only_full_attention_llama_and_qwen2_models_take_the_static_path(tiny_tokenizer_dir):
    from transformers import AutoModelForCausalLM, GPT2Config, Qwen2Config

    vocab = len(load_tokenizer(tiny_tokenizer_dir))
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=vocab, n_embd=32, n_layer=1, n_head=2))
    sliding = Qwen2Config(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=64, use_sliding_window=True, sliding_window=16,
                          max_window_layers=0)
    assert not supports(gpt2)
    assert not supports(AutoModelForCausalLM.from_config(sliding))
    assert supports(AutoModelForCausalLM.from_config(Qwen2Config(**_qwen2(vocab))))


@pytest.mark.gpu
async def test_cuda_graph_decoding_matches_the_dynamic_path(family, prompts):
    """fp32 on the GPU, so a near tie cannot flip between the two paths' summation orders."""
    from rl.engine import EmbeddedEngine, EmbeddedEngineConfig

    def engine(**kw: Any) -> EmbeddedEngine:
        return EmbeddedEngine.from_hf_config(family, EmbeddedEngineConfig(device="cuda", dtype="float32", **kw), seed=0)

    dynamic, graphs = engine(), engine(static_decode=True)
    graphs.model.load_state_dict(dynamic.model.state_dict())
    jobs = [(p, params(48 + 7 * i, **GREEDY)) for i, p in enumerate(prompts * 3)]
    async with dynamic.running():
        want = await gather(dynamic, jobs)
    async with graphs.running():
        got = await gather(graphs, jobs)
        await graphs.release_memory(["weights", "kv_cache"])  # drops the buffers and graphs
        await graphs.resume_memory()
        again = await gather(graphs, jobs)
    assert graphs.runner.counts["static_failures"] == 0  # the fallback would hide a failing capture
    assert graphs.runner.static.captures > 0 and graphs.runner.counts["static_steps"] > 0
    assert sum(a.token_ids == b.token_ids for a, b in zip(want, got)) >= len(jobs) * 9 // 10
    assert sum(a.token_ids == b.token_ids for a, b in zip(got, again)) >= len(jobs) * 9 // 10
    for (prompt, _), gen in zip(jobs, got, strict=True):
        assert gen.logprobs == pytest.approx(full_forward_logprobs(graphs, prompt, gen.token_ids), abs=1e-3)


@pytest.mark.gpu
async def test_cuda_graphs_are_captured_again_when_a_batch_outgrows_the_kv_buffers(family, prompts):
    """Rows that decode past MIN_COLUMNS grow the KV buffers, which drops every captured graph
    (and their memory pool) mid-run; the steps after that are captured anew and still give the
    model's own log-probs."""
    from rl.engine import EmbeddedEngine, EmbeddedEngineConfig
    from rl.engine.static_decode import MIN_COLUMNS

    graphs = EmbeddedEngine.from_hf_config(
        family, EmbeddedEngineConfig(device="cuda", dtype="float32", static_decode=True), seed=0)
    jobs = [(p, params(MIN_COLUMNS + 64 + 16 * i, **GREEDY)) for i, p in enumerate(prompts[:3])]
    async with graphs.running():
        got = await gather(graphs, jobs)
    assert graphs.runner.counts["static_failures"] == 0  # the fallback would hide a failing capture
    assert graphs.runner.static.keys[0].shape[2] > MIN_COLUMNS  # the buffers grew
    assert graphs.runner.static.captures >= 2 and graphs.runner.counts["static_steps"] > MIN_COLUMNS
    assert [len(g.token_ids) for g in got] == [j[1].max_new_tokens for j in jobs]
    for (prompt, _), gen in zip(jobs, got, strict=True):
        assert gen.logprobs == pytest.approx(full_forward_logprobs(graphs, prompt, gen.token_ids), abs=1e-3)
