"""EmbeddedEngine on a tiny random Qwen2 (vocabulary of the tiny tokenizer): real decoding, real
KV cache, checked against one-at-a-time generation and full forward passes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import anyio
import pytest
import torch

from agentcore.engine import Engine, EngineError, Generation, SamplingParams
from agentcore.sglang import rid_prefix
from agentcore.tiny_tokenizer import load_tokenizer
from rl.engine import EmbeddedEngine, EmbeddedEngineConfig

BOUND_S = 60  # a hang fails the test, not the suite
GREEDY = dict(temperature=0.0)


@pytest.fixture(scope="module")
def hf_config(tiny_tokenizer_dir) -> dict[str, Any]:
    from transformers import Qwen2Config

    vocab = len(load_tokenizer(tiny_tokenizer_dir))
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=1024,
    ).to_dict()


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer_dir) -> list[list[int]]:
    tok = load_tokenizer(tiny_tokenizer_dir)
    texts = [
        "Write a relu kernel.",
        "a",
        "Profile the softmax kernel against eager PyTorch now.",
        '<tool_call>\n{"name": "compile"}',
    ]
    return [tok.encode(t) for t in texts]


def make_engine(hf_config: dict[str, Any], seed: int = 0, **overrides: Any) -> EmbeddedEngine:
    config = EmbeddedEngineConfig(device="cpu", **{"batch_wait_ms": 20.0, **overrides})
    return EmbeddedEngine.from_hf_config(hf_config, config, seed=seed)


def params(n: int, **kw: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, **kw)


async def wait_until(predicate: Callable[[], bool]) -> None:
    with anyio.fail_after(BOUND_S):
        while not predicate():
            await anyio.sleep(0.005)


async def gather(
    engine: EmbeddedEngine, jobs: list[tuple[list[int], SamplingParams]]
) -> list[Generation]:
    """Submit all jobs at once and wait for every answer."""
    results: list[Generation | None] = [None] * len(jobs)

    async def one(i: int) -> None:
        results[i] = await engine.generate(jobs[i][0], jobs[i][1], session_id=f"s{i}")

    with anyio.fail_after(BOUND_S):
        async with anyio.create_task_group() as tg:
            for i in range(len(jobs)):
                tg.start_soon(one, i)
    return [r for r in results if r is not None]


def full_forward_logprobs(
    engine: EmbeddedEngine, prompt: list[int], output: list[int], temperature: float = 1.0
) -> list[float]:
    """log p(output[i] | prompt, output[:i]) from one forward pass over prompt + output, on the
    engine's device."""
    ids = torch.tensor([prompt + output], device=engine.device)
    with torch.no_grad():
        logits = engine.model(input_ids=ids, use_cache=False).logits[0].float()  # [T, V]
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(output) - 1)
    return logprobs[positions, torch.tensor(output)].tolist()


async def test_engine_implements_the_protocol(hf_config):
    assert isinstance(make_engine(hf_config), Engine)


@pytest.mark.parametrize("max_prefill_tokens", [16384, 16, 3])  # groups merged; chunks
async def test_batched_greedy_equals_one_at_a_time(hf_config, prompts, max_prefill_tokens):
    # Different budgets make rows leave at different times: compaction and trimming run.
    jobs = [(p, params(n, **GREEDY)) for p, n in zip(prompts, (12, 20, 5, 16))]
    engine = make_engine(hf_config, max_prefill_tokens=max_prefill_tokens)
    async with engine.running():
        alone = [await engine.generate(p, ps, session_id="solo") for p, ps in jobs]
        together = await gather(engine, jobs)
    for a, b in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert engine.statistics().max_batch_size == len(jobs)


async def test_logprobs_equal_a_full_forward_pass(hf_config, prompts):
    engine = make_engine(hf_config)
    jobs = [
        (p, params(10, temperature=t, seed=i))
        for i, (p, t) in enumerate(zip(prompts, (1.0, 0.7, 1.0, 1.3)))
    ]
    async with engine.running():
        gens = await gather(engine, jobs)
    for (prompt, ps), gen in zip(jobs, gens, strict=True):
        expected = full_forward_logprobs(engine, prompt, gen.token_ids, ps.temperature)
        assert gen.logprobs == pytest.approx(expected, abs=1e-4)


async def test_stop_token_ends_generation_and_is_kept(hf_config, prompts):
    engine = make_engine(hf_config)
    async with engine.running():
        free = await engine.generate(prompts[0], params(12, **GREEDY), session_id="a")
        stop = free.token_ids[4]
        first = free.token_ids.index(stop)
        gen = await engine.generate(
            prompts[0], params(12, stop_token_ids=(stop,), **GREEDY), session_id="b"
        )
    assert gen.finish_reason == "stop"
    assert gen.token_ids == free.token_ids[: first + 1]
    assert len(gen.logprobs) == len(gen.token_ids)


async def test_max_new_tokens_is_respected(hf_config, prompts):
    engine = make_engine(hf_config)
    async with engine.running():
        gens = await gather(engine, [(prompts[0], params(n)) for n in (0, 1, 7)])
    assert [len(g.token_ids) for g in gens] == [0, 1, 7]
    assert [g.finish_reason for g in gens] == ["length"] * 3


async def test_context_limit_ends_with_length(hf_config, prompts):
    prompt = prompts[2]
    engine = make_engine(hf_config, max_context_tokens=len(prompt) + 3)
    async with engine.running():
        fits = await engine.generate(prompt, params(50), session_id="a")
        full = await engine.generate(prompt + prompt, params(50), session_id="b")
    assert (len(fits.token_ids), fits.finish_reason) == (3, "length")
    assert (full.token_ids, full.finish_reason) == ([], "length")


async def test_concurrent_requests_share_decode_steps(hf_config, prompts):
    engine = make_engine(hf_config)
    async with engine.running():
        await gather(engine, [(p, params(8)) for p in prompts])
    stats = engine.statistics()
    assert stats.mean_batch_size > 1.0
    assert stats.decode_steps < 4 * 8
    assert stats.requests == 4 and stats.tokens_generated == 32


async def test_kv_slot_budget_bounds_the_batch(hf_config, prompts):
    jobs = [(p, params(6, **GREEDY)) for p in prompts]
    widest = max(len(p) + 6 for p in prompts)
    engine = make_engine(hf_config, max_batch_tokens=2 * widest)
    async with engine.running():
        together = await gather(engine, jobs)
        alone = [await engine.generate(p, ps, session_id="solo") for p, ps in jobs]
    assert engine.statistics().max_batch_size == 2
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]


async def late_join(engine: EmbeddedEngine, long_job, late_job, after_steps: int) -> tuple[list, list, list]:
    """Each job alone, then `late_job` sent once `long_job` has decoded `after_steps` steps:
    (the tokens alone, the long job's and the late job's tokens together)."""
    async with engine.running():
        alone = [(await engine.generate(*job, session_id="solo")).token_ids for job in (long_job, late_job)]
        steps = engine.statistics().decode_steps
        with anyio.fail_after(BOUND_S):
            async with anyio.create_task_group() as tg:
                first: list[Generation] = []

                async def long_request() -> None:
                    first.append(await engine.generate(*long_job, session_id="long"))

                tg.start_soon(long_request)
                await wait_until(lambda: engine.statistics().decode_steps >= steps + after_steps)
                late = await engine.generate(*late_job, session_id="late")
                assert engine.statistics().running == 1  # the long one is still decoding
    return alone, first[0].token_ids, late.token_ids


async def test_request_joins_a_running_batch(hf_config, prompts):
    long_job, late_job = (prompts[1], params(40, **GREEDY)), (prompts[2], params(6, **GREEDY))
    engine = make_engine(hf_config)
    alone, first, late = await late_join(engine, long_job, late_job, 3)
    assert engine.statistics().max_batch_size == 2
    assert [first, late] == alone


async def test_seeded_sampling_is_reproducible_in_any_batch(hf_config, prompts):
    engine = make_engine(hf_config)
    seeded = (prompts[0], params(16, seed=7))
    async with engine.running():
        alone = await engine.generate(*seeded, session_id="a")
        crowd = await gather(engine, [seeded, (prompts[1], params(16)), (prompts[2], params(9))])
        other = await engine.generate(prompts[0], params(16, seed=8), session_id="b")
    assert crowd[0].token_ids == alone.token_ids
    assert other.token_ids != alone.token_ids


async def test_top_k_and_top_p_keep_samples_inside_the_nucleus(hf_config, prompts):
    engine = make_engine(hf_config)
    async with engine.running():
        gen = await engine.generate(prompts[0], params(1, top_k=3, seed=1), session_id="k")
        nucleus = await engine.generate(prompts[0], params(1, top_p=1e-6, seed=2), session_id="p")
    logits = engine.model(input_ids=torch.tensor([prompts[0]])).logits[0, -1]
    assert gen.token_ids[0] in logits.topk(3).indices.tolist()
    assert nucleus.token_ids == [int(logits.argmax())]


def test_a_bf16_engine_keeps_the_rope_frequencies_in_fp32(hf_config):
    """Parameters go to bf16, fp32 buffers (RoPE's inv_freq) stay exact: rounded to bf16 they
    turn the rotary angle at position 2,000 by up to a radian and the engine samples another
    policy than the fp32 learner (seen on the GPU smoke: log-prob gap 0.5 nats per token)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(hf_config)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields))
    buffers = {name: b.clone() for name, b in model.named_buffers() if b.is_floating_point()}
    engine = EmbeddedEngine(model, EmbeddedEngineConfig(device="cpu", dtype="bfloat16"))
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    kept = dict(engine.model.named_buffers())
    assert "model.rotary_emb.inv_freq" in buffers
    for name, want in buffers.items():
        assert kept[name].dtype == torch.float32 and torch.equal(kept[name], want), name


async def test_update_weights_changes_outputs_and_restores_them(hf_config, prompts):
    engine = make_engine(hf_config)
    original = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    torch.manual_seed(1)
    perturbed = {k: v + 0.5 * torch.randn_like(v) for k, v in original.items()}
    job = (prompts[0], params(8, **GREEDY))
    async with engine.running():
        before = await engine.generate(*job, session_id="a")
        await engine.update_weights(perturbed.items(), version=1)
        after = await engine.generate(*job, session_id="b")
        await engine.update_weights(original.items(), version=2)
        restored = await engine.generate(*job, session_id="c")
    assert (before.weight_version, after.weight_version, restored.weight_version) == (0, 1, 2)
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    assert restored.token_ids == before.token_ids
    assert restored.logprobs == pytest.approx(before.logprobs, abs=1e-6)


async def test_update_weights_in_buckets_waits_for_the_running_batch(hf_config, prompts):
    engine = make_engine(hf_config)
    items = [(k, v.detach().clone() * 0.5) for k, v in engine.model.state_dict().items()]
    async with engine.running():
        async with anyio.create_task_group() as tg:
            done: list[Generation] = []

            async def running_request() -> None:
                done.append(await engine.generate(prompts[0], params(30), session_id="r"))

            tg.start_soon(running_request)
            await wait_until(lambda: engine.statistics().running == 1)
            await engine.begin_update()  # returns once the batch has ended
            assert len(done) == 1
            await engine.load_bucket(items[: len(items) // 2])
            await engine.load_bucket(items[len(items) // 2 :])
            engine.end_update(5)
        gen = await engine.generate(prompts[0], params(2), session_id="n")
    assert done[0].weight_version == 0 and len(done[0].token_ids) == 30
    assert gen.weight_version == 5
    state = engine.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in items)


async def test_bad_weight_name_or_shape_raises_and_changes_nothing(hf_config, prompts):
    engine = make_engine(hf_config)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    name, tensor = next(iter(before.items()))
    async with engine.running():
        with pytest.raises(ValueError, match="model.no_such.weight"):
            await engine.update_weights(
                [(name, tensor + 1), ("model.no_such.weight", tensor)], version=1
            )
        with pytest.raises(ValueError, match=name):
            await engine.update_weights([(name, tensor[:1])], version=1)
        gen = await engine.generate(prompts[0], params(2), session_id="a")  # still admitting
    assert gen.weight_version == 0 and engine.weight_version == 0
    assert all(torch.equal(engine.model.state_dict()[k], v) for k, v in before.items())


async def test_abort_returns_partial_output_and_generate_resumes(hf_config, prompts):
    engine = make_engine(hf_config)
    job = (prompts[0], params(40, **GREEDY))
    async with engine.running():
        unbroken = await engine.generate(*job, session_id="u")
        base = engine.statistics().decode_steps

        async def abort_after_3_steps() -> None:
            await wait_until(lambda: engine.statistics().decode_steps >= base + 3)
            assert engine.abort(rid_prefix("x")) == 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(abort_after_3_steps)
            piece = await engine.generate_once(*job, rid=rid_prefix("x") + "1")
        base = engine.statistics().decode_steps
        async with anyio.create_task_group() as tg:
            tg.start_soon(abort_after_3_steps)
            resumed = await engine.generate(*job, session_id="x")
    assert piece.finish_reason == "abort" and 3 <= len(piece.token_ids) < 40
    assert piece.token_ids == unbroken.token_ids[: len(piece.token_ids)]
    assert resumed.token_ids == unbroken.token_ids and resumed.finish_reason == "length"
    assert engine.statistics().aborted == 2


async def test_pause_holds_requests_until_resume(hf_config, prompts):
    engine = make_engine(hf_config)
    async with engine.running():
        engine.pause()
        async with anyio.create_task_group() as tg:
            done: list[Generation] = []

            async def request() -> None:
                done.append(await engine.generate(prompts[0], params(4), session_id="p"))

            tg.start_soon(request)
            await wait_until(lambda: engine.statistics().queued == 1)
            await anyio.sleep(0.1)
            assert not done and engine.statistics().decode_steps == 0
            engine.resume()
    assert len(done[0].token_ids) == 4


async def test_pause_in_abort_mode_aborts_running_requests(hf_config, prompts):
    engine = make_engine(hf_config)
    async with engine.running():
        async with anyio.create_task_group() as tg:
            pieces: list[Generation] = []

            async def request() -> None:
                pieces.append(await engine.generate_once(prompts[0], params(200)))

            tg.start_soon(request)
            await wait_until(lambda: engine.statistics().decode_steps >= 2)
            engine.pause("abort")
        assert pieces[0].finish_reason == "abort" and len(pieces[0].token_ids) < 200
        engine.resume()


async def test_release_memory_holds_requests_until_resumed(hf_config, prompts):
    engine = make_engine(hf_config)
    async with engine.running():
        await engine.release_memory()
        async with anyio.create_task_group() as tg:
            done: list[Generation] = []

            async def request() -> None:
                done.append(await engine.generate(prompts[0], params(3), session_id="m"))

            tg.start_soon(request)
            await wait_until(lambda: engine.statistics().queued == 1)
            await engine.resume_memory(["kv_cache"])
            await anyio.sleep(0.1)
            assert not done  # weights and cuda_graph are still released
            await engine.resume_memory()
    assert len(done[0].token_ids) == 3
    with pytest.raises(ValueError, match="bogus"):
        await engine.release_memory(["bogus"])



async def test_a_release_with_nothing_generated_since_the_last_one_frees_nothing(hf_config, prompts):
    engine = make_engine(hf_config)
    frees: list[object] = []
    move = engine.runner.move_weights
    engine.runner.move_weights = lambda device: (frees.append(device), move(device))
    async with engine.running():
        for _ in range(2):  # two updates in a row (rft steps): the second has nothing to free
            await engine.release_memory(["kv_cache"])
            await engine.resume_memory(["kv_cache"])
        assert frees == [None]
        await engine.generate(prompts[0], params(2), session_id="g")
        await engine.release_memory(["kv_cache"])  # a batch ran since: free again
        await engine.resume_memory(["kv_cache"])
    assert frees == [None, None]

async def test_stopping_the_engine_fails_pending_requests(hf_config, prompts):
    engine = make_engine(hf_config)
    failures: list[BaseException] = []

    async def request() -> None:
        try:
            await engine.generate(prompts[0], params(4), session_id="s")
        except EngineError as exc:
            failures.append(exc)

    engine.pause()
    async with anyio.create_task_group() as outer:
        async with anyio.create_task_group() as tg:
            await tg.start(engine.serve)
            outer.start_soon(request)
            await wait_until(lambda: engine.statistics().queued == 1)
            tg.cancel_scope.cancel()
    assert len(failures) == 1
    with pytest.raises(EngineError):
        await engine.generate(prompts[0], params(4), session_id="late")


async def test_cancelled_caller_frees_its_row(hf_config, prompts):
    engine = make_engine(hf_config)
    async with engine.running():
        with anyio.move_on_after(BOUND_S) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    functools.partial(engine.generate, session_id="c"), prompts[0], params(500)
                )
                await wait_until(lambda: engine.statistics().decode_steps >= 2)
                tg.cancel_scope.cancel()
        assert not scope.cancelled_caught
        await wait_until(lambda: engine.statistics().requests == 1)
    assert engine.statistics().tokens_generated < 500


async def test_invalid_requests_raise_value_error(hf_config):
    engine = make_engine(hf_config)
    bad = [
        ([], params(1)),
        ([engine.vocab_size], params(1)),
        ([-1], params(1)),
        ([1], params(-1)),
        ([1], params(1, top_k=0)),
        ([1], params(1, top_p=0.0)),
    ]
    for ids, ps in bad:
        with pytest.raises(ValueError):
            await engine.generate(ids, ps, session_id="v")


@pytest.mark.gpu
async def test_cuda_bfloat16_batch_and_weight_offload(hf_config, prompts):
    engine = EmbeddedEngine.from_hf_config(hf_config, EmbeddedEngineConfig(device="cuda"), seed=0)
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    assert engine.device == torch.device("cuda", torch.cuda.current_device())  # set_device needs the index
    jobs = [(p, params(16, seed=i)) for i, p in enumerate(prompts * 4)]
    async with engine.running():
        gens = await gather(engine, jobs)
        await engine.release_memory(["weights", "kv_cache"])
        assert next(engine.model.parameters()).device.type == "cpu"
        await engine.resume_memory()
        again = await gather(engine, jobs)
    assert next(engine.model.parameters()).device.type == "cuda"
    assert engine.statistics().max_batch_size == len(jobs)
    for (prompt, _), gen in zip(jobs, gens, strict=True):  # bf16 padding noise
        assert gen.logprobs == pytest.approx(full_forward_logprobs(engine, prompt, gen.token_ids), abs=0.1)
    assert sum(a.token_ids == b.token_ids for a, b in zip(gens, again)) >= len(jobs) // 2
