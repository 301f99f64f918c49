"""EngineServer on loopback, driven by the project's real SGLangClient (and raw HTTP where the
client hides what is checked): same tokens as the engine, aborts, pause, weight updates."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
import torch

from agentcore.engine import Generation, SamplingParams
from agentcore.sglang import SGLangClient, SGLangClientConfig, WeightUpdateError
from agentcore.tiny_tokenizer import load_tokenizer
from rl.engine import (
    EmbeddedEngine,
    EmbeddedEngineConfig,
    EngineServer,
    HttpServer,
    HttpServerConfig,
)

BOUND_S = 60
N_LONG = 400  # tokens: long enough on any machine for an abort to land mid-generation


@pytest.fixture(scope="module")
def hf_config(tiny_tokenizer_dir) -> dict[str, Any]:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(load_tokenizer(tiny_tokenizer_dir)),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=1024,
    ).to_dict()


@pytest.fixture(scope="module")
def prompt(tiny_tokenizer_dir) -> list[int]:
    return load_tokenizer(tiny_tokenizer_dir).encode("Write a fast softmax kernel.")


def make_engine(hf_config: dict[str, Any]) -> EmbeddedEngine:
    return EmbeddedEngine.from_hf_config(hf_config, EmbeddedEngineConfig(device="cpu"), seed=0)


@asynccontextmanager
async def serving(
    engine: EmbeddedEngine, **routes: Any
) -> AsyncIterator[tuple[EngineServer, SGLangClient]]:
    server = EngineServer(engine, routes={("POST", p): h for p, h in routes.items()})
    async with anyio.create_task_group() as tg:
        await tg.start(engine.serve)
        await tg.start(server.serve)
        config = SGLangClientConfig(base_url=server.url, backoff_base_s=0.01, max_retries=1)
        async with SGLangClient(config) as client:
            with anyio.fail_after(BOUND_S):
                yield server, client
        tg.cancel_scope.cancel()


async def wait_until(predicate: Callable[[], bool]) -> None:
    with anyio.fail_after(BOUND_S):
        while not predicate():
            await anyio.sleep(0.005)


def greedy(n: int, **kw: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0, **kw)


async def test_client_generates_what_the_engine_generates(hf_config, prompt):
    engine = make_engine(hf_config)
    async with serving(engine) as (_, client):
        direct = await engine.generate(prompt, greedy(12), session_id="d")
        remote = await client.generate(prompt, greedy(12), session_id="r")
        sampled = await client.generate(
            prompt, SamplingParams(max_new_tokens=6, seed=3), session_id="s"
        )
        again = await engine.generate(
            prompt, SamplingParams(max_new_tokens=6, seed=3), session_id="t"
        )
    assert remote.token_ids == direct.token_ids
    assert remote.logprobs == pytest.approx(direct.logprobs, abs=1e-6)
    assert (remote.finish_reason, remote.prompt_tokens, remote.weight_version) == (
        "length",
        len(prompt),
        0,
    )
    assert sampled.token_ids == again.token_ids


async def test_stop_token_comes_back_as_stop(hf_config, prompt):
    engine = make_engine(hf_config)
    async with serving(engine) as (_, client):
        free = await client.generate(prompt, greedy(8), session_id="a")
        stopped = await client.generate(
            prompt, greedy(8, stop_token_ids=(free.token_ids[2],)), session_id="b"
        )
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(free.token_ids[2]) + 1]


async def test_abort_request_returns_partial_output_and_the_client_resumes(hf_config, prompt):
    engine = make_engine(hf_config)
    async with serving(engine) as (server, client):
        unbroken = await engine.generate(prompt, greedy(N_LONG), session_id="u")
        async with httpx.AsyncClient(base_url=server.url) as raw:
            async with anyio.create_task_group() as tg:
                answers: list[dict[str, Any]] = []

                async def post() -> None:
                    body = {
                        "input_ids": prompt,
                        "rid": "raw/1",
                        "return_logprob": True,
                        "sampling_params": {"max_new_tokens": N_LONG, "temperature": 0.0},
                    }
                    answers.append((await raw.post("/generate", json=body)).json())

                steps = engine.statistics().decode_steps
                tg.start_soon(post)
                await wait_until(lambda: engine.statistics().decode_steps >= steps + 3)
                await client.abort_request(rid="raw/")
        meta = answers[0]["meta_info"]
        assert meta["finish_reason"]["type"] == "abort"
        assert 3 <= len(answers[0]["output_ids"]) < N_LONG
        assert [e[1] for e in meta["output_token_logprobs"]] == answers[0]["output_ids"]

        async with anyio.create_task_group() as tg:
            resumed: list[Generation] = []

            async def generate() -> None:
                resumed.append(await client.generate(prompt, greedy(N_LONG), session_id="c"))

            tg.start_soon(generate)
            steps = engine.statistics().decode_steps
            await wait_until(lambda: engine.statistics().decode_steps >= steps + 3)
            await client.abort_request(abort_all=True)
    assert resumed[0].token_ids == unbroken.token_ids
    assert client.statistics().resumes == 1
    assert engine.statistics().aborted == 2


async def test_pause_and_continue(hf_config, prompt):
    engine = make_engine(hf_config)
    async with serving(engine) as (_, client):
        await client.pause_generation(mode="in_place")
        assert engine.paused
        async with anyio.create_task_group() as tg:
            done: list[Generation] = []

            async def generate() -> None:
                done.append(await client.generate(prompt, greedy(4), session_id="p"))

            tg.start_soon(generate)
            await wait_until(lambda: engine.statistics().queued == 1)
            assert not await client.flush_cache()  # a request is waiting
            await client.continue_generation()
        assert len(done[0].token_ids) == 4
        assert await client.flush_cache()


async def test_update_weights_from_disk_bumps_the_version(hf_config, prompt, tmp_path):
    engine = make_engine(hf_config)
    changed = make_engine(hf_config)
    with torch.no_grad():
        changed.model.model.layers[0].mlp.down_proj.weight.mul_(-3.0)
    changed.model.save_pretrained(tmp_path / "ckpt")
    async with serving(engine) as (_, client):
        before = await client.generate(prompt, greedy(8), session_id="a")
        await client.update_weights_from_disk(str(tmp_path / "ckpt"))
        assert await client.get_weight_version() == 1
        after = await client.generate(prompt, greedy(8), session_id="b")
        await client.update_weights_from_disk(str(tmp_path / "ckpt"), weight_version=7)
        assert await client.get_weight_version() == 7
        with pytest.raises(WeightUpdateError, match="safetensors"):
            await client.update_weights_from_disk(str(tmp_path / "missing"))
    async with changed.running():
        expected = await changed.generate(prompt, greedy(8), session_id="c")
    assert after.weight_version == 1
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    assert after.token_ids == expected.token_ids
    assert after.logprobs == pytest.approx(expected.logprobs, abs=1e-6)


async def test_control_endpoints_answer_like_sglang(hf_config):
    engine = make_engine(hf_config)
    async with serving(engine) as (server, client):
        assert await client.health_generate()
        info = await client.get_server_info()
        await client.release_memory_occupation(["kv_cache"])
        assert engine.statistics().holds == ("memory",)
        await client.resume_memory_occupation(["kv_cache"])
        assert engine.statistics().holds == ()
        async with httpx.AsyncClient(base_url=server.url) as raw:
            assert (await raw.get("/health")).status_code == 200
            assert (await raw.post("/update_weights_from_tensor", json={})).json()[
                "success"
            ] is False
            refused = await raw.post("/generate", json={"text": "hi", "sampling_params": {}})
    assert info.version == "embedded" and info.raw["weight_version"] == "0"
    assert refused.status_code == 400 and "token ids" in refused.json()["error"]["message"]


async def test_extra_routes_share_the_server(hf_config):
    engine = make_engine(hf_config)

    async def step(body: dict[str, Any]) -> tuple[int, Any]:
        return 200, {"echo": body, "version": engine.weight_version}

    async with serving(engine, **{"/learner/step": step}) as (server, _):
        async with httpx.AsyncClient(base_url=server.url) as raw:
            answer = await raw.post("/learner/step", json={"n": 3})
            server.add_route("GET", "/learner/late", step)
            late = await raw.get("/learner/late")
    assert answer.json() == {"echo": {"n": 3}, "version": 0}
    assert late.json() == {"echo": {}, "version": 0}


# ---------------------------------------------------------------------------------------------
# The HTTP layer on its own.


@asynccontextmanager
async def http_server(routes: dict[tuple[str, str], Any]) -> AsyncIterator[HttpServer]:
    server = HttpServer(routes, HttpServerConfig(port=0))
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        with anyio.fail_after(BOUND_S):
            yield server
        tg.cancel_scope.cancel()


async def test_http_keep_alive_status_codes_and_errors():
    async def echo(body: dict[str, Any]) -> tuple[int, Any]:
        return 200, body

    async def broken(body: dict[str, Any]) -> tuple[int, Any]:
        raise RuntimeError("boom")

    async with http_server({("POST", "/echo"): echo, ("POST", "/broken"): broken}) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            answers = [await client.post("/echo", json={"i": i}) for i in range(3)]
            assert server.port and server.requests == 3
            missing = await client.post("/nope", json={})
            wrong_method = await client.get("/echo")
            bad_json = await client.post("/echo", content=b"{not json")
            not_object = await client.post("/echo", json=[1, 2])
            failed = await client.post("/broken", json={})
            empty = await client.post("/echo")
    assert [a.json() for a in answers] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert [a.headers["connection"] for a in answers] == ["keep-alive"] * 3
    assert (missing.status_code, wrong_method.status_code) == (404, 405)
    assert (bad_json.status_code, not_object.status_code) == (400, 400)
    assert failed.status_code == 500 and "boom" in failed.json()["message"]
    assert empty.json() == {}


async def test_http_client_hangup_cancels_the_handler():
    started, cancelled = anyio.Event(), anyio.Event()

    async def slow(body: dict[str, Any]) -> tuple[int, Any]:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()
        return 200, None

    async with http_server({("POST", "/slow"): slow}) as server:
        stream = await anyio.connect_tcp("127.0.0.1", server.port)
        await stream.send(b"POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        await started.wait()
        await stream.aclose()
        await cancelled.wait()


async def test_disconnected_generate_is_aborted_in_the_engine(hf_config, prompt):
    engine = make_engine(hf_config)
    async with serving(engine) as (server, client):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                functools.partial(client.generate, session_id="gone"), prompt, greedy(2000)
            )
            await wait_until(lambda: engine.statistics().decode_steps >= 2)
            tg.cancel_scope.cancel()  # httpx closes the connection
        await wait_until(lambda: engine.statistics().requests == 1)
    assert engine.statistics().aborted == 1
    assert engine.statistics().tokens_generated < 2000
