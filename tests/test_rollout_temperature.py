"""PPO at the rollouts' temperature: the learner's policy is softmax(logits / t), the distribution
the engine sampled from. Checked against the embedded engine's own log-probs (another code path:
its sampler), a full forward pass, and the learner rank's PPO step."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import torch

from agentcore.engine import SamplingParams
from agentcore.tiny_tokenizer import load_tokenizer
from rl.config import apply_overrides
from rl.engine import EmbeddedEngine, EmbeddedEngineConfig
from rl.learner.actor_critic import Learner, policy_temperature
from rl.learner.fsdp import init_distributed
from rl.learner.models import Actor, ModelConfig, build_actor, build_critic, tiny_qwen2_config
from rl.learner.update import PPOConfig, compute_logprobs, ppo_step
from rl.recipes import smoke_cpu
from rl.samples import Sample

EXACT = PPOConfig(token_budget=512, value_clip=None)


@pytest.fixture(scope="module")
def hf_config(tiny_tokenizer_dir) -> dict[str, Any]:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(load_tokenizer(tiny_tokenizer_dir)), hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, max_position_embeddings=1024,
    ).to_dict()  # fmt: skip


async def _sampled(hf_config, prompt: list[int], temperature: float) -> tuple[EmbeddedEngine, list[int], list[float]]:
    """An engine and one generation of 24 tokens from it at `temperature` (seeded)."""
    engine = EmbeddedEngine.from_hf_config(hf_config, EmbeddedEngineConfig(device="cpu", batch_wait_ms=5.0), seed=0)
    async with engine.running():
        gen = await engine.generate(prompt, SamplingParams(max_new_tokens=24, temperature=temperature, seed=3),
                                    session_id="t")
    return engine, gen.token_ids, gen.logprobs


def _sample(prompt: list[int], output: list[int], logprobs: list[float], reward: float = 1.0, group="g") -> Sample:
    return Sample(sample_id=f"s{reward}", group_id=group, token_ids=prompt + output,
                  action_mask=[0] * len(prompt) + [1] * len(output),
                  behaviour_logprobs=[0.0] * len(prompt) + list(logprobs), reward=reward, weight_version=0)


def test_actor_logprobs_and_entropy_at_a_temperature_are_the_scaled_softmax():
    cfg = ModelConfig(hf_config=tiny_qwen2_config(vocab_size=64, hidden=32, intermediate=64), logprob_chunk_tokens=7)
    actor = build_actor(cfg, "cpu").eval()
    on_actions = Actor(actor.lm, cfg.logprob_chunk_tokens, head_on_actions_only=True)  # the same weights
    g = torch.Generator().manual_seed(0)
    ids, targets = torch.randint(0, 64, (1, 19), generator=g), torch.randint(0, 64, (1, 19), generator=g)
    pos = torch.arange(19)[None]
    mask = (torch.arange(19) >= 5).float()[None]
    logits = actor.lm(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
    for t in (1.0, 0.6, 1.4):
        full = torch.log_softmax(logits / t, dim=-1)
        want = full.gather(-1, targets[..., None])[..., 0]
        want_entropy = -(full.exp() * full).sum(-1)
        got, entropy = actor(ids, pos, targets, temperature=t)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        torch.testing.assert_close(entropy, want_entropy, atol=1e-5, rtol=0)
        got, _ = on_actions(ids, pos, targets, mask=mask, temperature=t)  # the LM head on the masked positions
        torch.testing.assert_close(got[mask > 0], want[mask > 0], atol=1e-5, rtol=0)


async def test_learner_logprobs_at_the_rollout_temperature_equal_the_engines(hf_config, tiny_tokenizer_dir):
    prompt = load_tokenizer(tiny_tokenizer_dir).encode("Write a relu kernel.")
    engine, output, behaviour = await _sampled(hf_config, prompt, 0.7)
    actor = Actor(engine.model).eval()
    sample = _sample(prompt, output, behaviour)
    (at_t,) = compute_logprobs(actor, [sample], EXACT, "cpu", temperature=0.7)
    (at_1,) = compute_logprobs(actor, [sample], EXACT, "cpu")
    assert at_t[len(prompt):].tolist() == pytest.approx(behaviour, abs=1e-4)
    assert max(abs(a - b) for a, b in zip(at_1[len(prompt):].tolist(), behaviour)) > 1e-2


async def test_a_ppo_step_at_the_rollouts_temperature_has_no_gap_to_the_behaviour_policy(hf_config, tiny_tokenizer_dir):
    prompt = load_tokenizer(tiny_tokenizer_dir).encode("Profile the softmax kernel.")
    engine, output, behaviour = await _sampled(hf_config, prompt, 0.6)
    actor = Actor(engine.model)
    critic = build_critic(ModelConfig(hf_config=hf_config), "cpu")
    samples = [_sample(prompt, output, behaviour, reward=1.0), _sample(prompt, output, behaviour, reward=-1.0)]

    def gap(temperature: float) -> float:
        opts = [torch.optim.SGD(m.parameters(), lr=0.0) for m in (actor, critic)]
        return ppo_step(actor, critic, *opts, samples, EXACT, "cpu", temperature=temperature)["logprob_gap"]

    assert gap(0.6) < 1e-4
    assert gap(1.0) > 1e-2


def test_the_learner_rank_trains_at_the_configured_rollout_temperature():
    dist = init_distributed()

    def learner(temperature: float) -> Learner:
        cfg = apply_overrides(smoke_cpu(), ["model.hf_config.hidden_size=32", "model.hf_config.intermediate_size=64",
                                            "ppo.token_budget=256", "optim.actor_lr=0", "optim.critic_lr=0",
                                            f"rollout.temperature={temperature}"])
        return Learner.build(cfg, dist)

    at_half = learner(0.5)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (40,), generator=g).tolist()
    plain = Sample(sample_id="s", group_id="g", token_ids=tokens, action_mask=[0] * 10 + [1] * 30,
                   behaviour_logprobs=[0.0] * 40, reward=1.0, weight_version=0)
    (lp,) = compute_logprobs(at_half.actor, [plain], at_half.cfg.ppo, "cpu", temperature=0.5)
    behaviour = [0.0] * 10 + lp[10:].tolist()  # what an engine sampling at 0.5 reports for these tokens
    samples = [msgspec.structs.replace(plain, sample_id=f"s{r}", behaviour_logprobs=behaviour, reward=r)
               for r in (1.0, -1.0)]
    assert at_half.step("ppo", samples)["logprob_gap"] < 1e-4
    assert learner(1.0).step("ppo", samples)["logprob_gap"] > 1e-2


def test_greedy_rollouts_train_at_temperature_one():
    assert policy_temperature(0.0) == 1.0
    assert policy_temperature(0.7) == 0.7
