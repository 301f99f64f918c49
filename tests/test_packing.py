"""rl.samples and rl.learner.packing: bins, alignment of packed rows, and packed forwards that equal
separate ones through the real Actor and Critic (tiny Qwen2 on CPU)."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from agentcore.types import Status, Timings, Trajectory
from rl.learner.models import ModelConfig, build_actor, build_critic, tiny_qwen2_config
from rl.learner.packing import (
    balance,
    collate,
    dummy_micro_batch,
    micro_batches,
    pack,
    to_positions,
    to_tokens,
)
from rl.samples import Sample, sample_from_trajectory

VOCAB = 48


def make_sample(i: int, token_ids: list[int], action_mask: list[int], reward: float = 1.0) -> Sample:
    return Sample(
        sample_id=f"s{i}",
        group_id="g",
        token_ids=token_ids,
        action_mask=action_mask,
        behaviour_logprobs=[-0.5 * (k + 1) * m for k, m in enumerate(action_mask)],
        reward=reward,
        weight_version=0,
    )


def random_samples(n: int, seed: int = 0, max_len: int = 24) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(3, max_len)
        prompt = rng.randint(1, 3)
        mask = [0] * prompt + [int(rng.random() < 0.7) for _ in range(length - prompt)]
        out.append(make_sample(i, [rng.randrange(VOCAB) for _ in range(length)], mask))
    return out


@pytest.fixture(scope="module")
def models():
    cfg = ModelConfig(hf_config=tiny_qwen2_config(vocab_size=VOCAB, hidden=32, intermediate=64), logprob_chunk_tokens=7)
    return build_actor(cfg, "cpu").eval(), build_critic(cfg, "cpu").eval()


# --- samples ---------------------------------------------------------------------------------


def trajectory(**changes) -> Trajectory:
    fields = dict(
        trajectory_id="t1", task_id="task", group_id="grp", sample_index=0,
        prompt_ids=[5, 6, 7], response_ids=[8, 9, 10, 11], logprobs=[-0.1, -0.2, -9.0, -0.4],
        loss_mask=[1, 1, 0, 1], turns=[], status=Status.COMPLETED, weight_version_min=3,
        weight_version_max=4, timings=Timings(), reward=0.75,
    )  # fmt: skip
    return Trajectory(**(fields | changes))


def test_sample_from_trajectory_concatenates_prompt_and_response():
    s = sample_from_trajectory(trajectory())
    assert s.token_ids == [5, 6, 7, 8, 9, 10, 11]
    assert s.action_mask == [0, 0, 0, 1, 1, 0, 1]
    # The tool-output token's engine log-prob (-9.0) is zeroed: masked positions hold 0.0.
    assert s.behaviour_logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, -0.4]
    assert (s.reward, s.weight_version, s.sample_id, s.group_id, s.truncated) == (0.75, 3, "t1", "grp", False)


def test_sample_from_trajectory_truncated_status():
    assert sample_from_trajectory(trajectory(status=Status.TRUNCATED_LENGTH)).truncated


def test_sample_from_trajectory_without_reward_raises():
    with pytest.raises(ValueError, match="t1"):
        sample_from_trajectory(trajectory(reward=None))


# --- pack ------------------------------------------------------------------------------------


def test_pack_first_fit_decreasing_example():
    # Sorted: 5 (0), 4 (1), 3 (2), 3 (3), 1 (4). 5 -> bin A (room 3); 4 -> bin B (room 4);
    # 3 -> A (room 0); 3 -> B (room 1); 1 -> B (room 0).
    assert pack([5, 4, 3, 3, 1], 8) == [[0, 2], [1, 3, 4]]


@pytest.mark.parametrize("seed", range(5))
def test_pack_bins_within_budget_and_every_sample_once(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 50) for _ in range(rng.randint(1, 60))]
    bins = pack(lengths, 64)
    assert all(sum(lengths[i] for i in b) <= 64 for b in bins)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))


def test_pack_finds_the_fewest_bins_where_first_fit_decreasing_needs_one_more():
    # FFD: 5+4 | 3+3+3 | 2 (three bins); the search finds 5+3+2 | 4+3+3.
    bins = pack([5, 4, 3, 3, 3, 2], 10)
    assert sorted(sorted(b) for b in bins) == [[0, 2, 5], [1, 3, 4]]


def test_pack_rows_filled_exactly_come_back_as_that_many_bins():
    """bench.system.learner's synthetic batch: documents that fill k rows exactly (FFD needed k + 1 for
    most of them)."""
    rng = random.Random(0)
    for _ in range(20):
        lengths = []
        for _row in range(2):
            left = 16384
            while left:
                n = left if left <= 8192 else min(rng.randint(256, 8192), left)
                lengths.append(n)
                left -= n
        assert len(pack(lengths, 16384)) == 2


@pytest.mark.parametrize("seed", range(5))
def test_pack_never_takes_more_bins_than_first_fit_decreasing(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 50) for _ in range(rng.randint(1, 40))]
    assert len(pack(lengths, 64)) <= len(pack(lengths, 64, search_nodes=0))


def test_pack_sample_over_budget_gets_a_bin_of_its_own():
    # A trajectory may grow past the micro-batch budget (max_context_tokens > token_budget in
    # node_8gpu); it trains alone instead of failing the update, and nothing is dropped.
    bins = pack([10, 70, 5, 90, 60], 64)
    assert [1] in bins and [3] in bins
    assert sorted(i for b in bins for i in b) == [0, 1, 2, 3, 4]
    for b in bins:
        assert len(b) == 1 or sum([10, 70, 5, 90, 60][i] for i in b) <= 64
    assert len(bins) == 4  # {70}, {90}, then 60 + 5 > 64: {60}, {10, 5}


def test_pack_rejects_a_budget_below_one():
    with pytest.raises(ValueError, match="token budget"):
        pack([1], 0)


# --- collate ---------------------------------------------------------------------------------


def test_collate_alignment_by_hand():
    a = make_sample(0, [10, 11, 12, 13], [0, 1, 0, 1])  # behaviour [0, -1.0, 0, -2.0]
    b = make_sample(1, [20, 21, 22], [0, 0, 1])  # behaviour [0, 0, -1.5]
    adv = [torch.tensor([0.0, 1.0, 0.0, 2.0]), torch.tensor([0.0, 0.0, 3.0])]
    mb = collate([a, b], [1, 0], {"advantages": adv})
    assert mb.input_ids.tolist() == [[20, 21, 22, 10, 11, 12, 13]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3]]
    # Position t predicts token t+1 of the same document; each document's last position -> 0.
    assert mb.targets.tolist() == [[21, 22, 0, 11, 12, 13, 0]]
    assert mb.mask.tolist() == [[0, 1, 0, 1, 0, 1, 0]]
    assert mb.behaviour_logprobs.tolist() == [[0, -1.5, 0, -1.0, 0, -2.0, 0]]
    assert mb.advantages.tolist() == [[0, 3, 0, 1, 0, 2, 0]]
    assert (mb.sample_index, mb.doc_lengths, mb.num_tokens, mb.num_action_tokens) == ([1, 0], [3, 4], 7, 3)


def test_split_and_to_tokens_invert_collate():
    samples = random_samples(6)
    values = [torch.arange(len(s.token_ids), dtype=torch.float32) + 100 * i for i, s in enumerate(samples)]
    for mb in micro_batches(samples, 40, {"old_values": values}):
        for i, pos in zip(mb.sample_index, mb.split(mb.old_values)):
            back = to_tokens(pos)
            assert back[1:].tolist() == values[i][1:].tolist()  # token 0 has no position before it


def test_to_positions_and_to_tokens():
    x = torch.tensor([1.0, 2.0, 3.0])
    assert to_positions(x).tolist() == [2.0, 3.0, 0.0]
    assert to_tokens(x).tolist() == [0.0, 1.0, 2.0]


def test_micro_batches_respect_budget_and_mask_count():
    samples = random_samples(20, seed=3)
    mbs = micro_batches(samples, 50)
    assert all(mb.num_tokens <= 50 for mb in mbs)
    assert sorted(i for mb in mbs for i in mb.sample_index) == list(range(20))
    assert sum(mb.num_action_tokens for mb in mbs) == sum(sum(s.action_mask[1:]) for s in samples)


def test_micro_batches_give_a_long_sample_its_own_row_and_say_so(caplog):
    samples = random_samples(6, seed=4, max_len=20)
    samples.append(make_sample(6, list(range(1, 81)), [0] * 10 + [1] * 70))  # 80 tokens, budget 50
    with caplog.at_level("WARNING", logger="cuda-agent.packing"):
        mbs = micro_batches(samples, 50)
    assert [mb.sample_index for mb in mbs if mb.num_tokens > 50] == [[6]]
    assert sorted(i for mb in mbs for i in mb.sample_index) == list(range(7))
    assert sum(mb.num_action_tokens for mb in mbs) == sum(sum(s.action_mask[1:]) for s in samples)
    assert "1 sample(s) longer than the micro-batch budget of 50 tokens (longest 80)" in caplog.text


def test_dummy_micro_batch_is_fully_masked_with_fields():
    mb = dummy_micro_batch(["advantages", "returns"])
    assert mb.num_action_tokens == 0 and mb.sample_index == []
    assert mb.advantages.shape == mb.returns.shape == mb.behaviour_logprobs.shape == (1, 2)
    assert mb.old_values is None


def test_unknown_field_raises():
    with pytest.raises(ValueError, match="advantage"):
        collate(random_samples(1), [0], {"advantage": [torch.zeros(3)]})


# --- balance ---------------------------------------------------------------------------------


def test_balance_assigns_each_sample_to_exactly_one_rank():
    samples = random_samples(13, seed=5)
    shares = [balance(samples, 4, r) for r in range(4)]
    ids = sorted(s.sample_id for share in shares for s in share)
    assert ids == sorted(s.sample_id for s in samples)


def test_balance_is_token_balanced_and_deterministic():
    samples = random_samples(40, seed=6, max_len=60)
    loads = [sum(len(s.token_ids) for s in balance(samples, 3, r)) for r in range(3)]
    # Greedy longest-first: the spread is at most one sample's length.
    assert max(loads) - min(loads) <= max(len(s.token_ids) for s in samples)
    assert balance(samples, 3, 1) == balance(list(samples), 3, 1)


# --- packed forwards -------------------------------------------------------------------------


def test_actor_packed_logprobs_equal_separate_forwards(models):
    actor, _ = models
    samples = random_samples(5, seed=1)
    (mb,) = micro_batches(samples, 200)
    with torch.no_grad():
        packed, packed_ent = actor(mb.input_ids, mb.position_ids, mb.targets)
        for i, lp, ent in zip(mb.sample_index, mb.split(packed), mb.split(packed_ent)):
            (one,) = micro_batches([samples[i]], 200)
            alone, alone_ent = actor(one.input_ids, one.position_ids, one.targets)
            torch.testing.assert_close(lp, alone[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(ent, alone_ent[0], atol=1e-5, rtol=0)


def test_chunked_logprobs_equal_full_log_softmax(models):
    actor, _ = models
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (1, 23))  # 23 tokens, chunks of 7: the last chunk is short
    pos, targets = torch.arange(23)[None], torch.randint(0, VOCAB, (1, 23))
    logprobs, entropy = actor(ids, pos, targets)
    logits = actor.lm(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
    full = torch.log_softmax(logits, dim=-1)
    expected = full.gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, -(full.exp() * full).sum(-1), atol=1e-5, rtol=0)
    # Gradients through the checkpointed chunks equal those of the plain path.
    grads = torch.autograd.grad(logprobs.sum() + entropy.sum(), actor.lm.model.embed_tokens.weight)
    ref = torch.autograd.grad(expected.sum() - (full.exp() * full).sum(), actor.lm.model.embed_tokens.weight)
    torch.testing.assert_close(grads[0], ref[0], atol=1e-5, rtol=1e-4)


def test_critic_packed_values_equal_separate_forwards(models):
    critic = copy.deepcopy(models[1])
    torch.nn.init.normal_(critic.value_head.weight)  # the zero-init head would make this vacuous
    samples = random_samples(4, seed=2)
    (mb,) = micro_batches(samples, 200)
    with torch.no_grad():
        packed = critic(mb.input_ids, mb.position_ids)
        for i, v in zip(mb.sample_index, mb.split(packed)):
            (one,) = micro_batches([samples[i]], 200)
            torch.testing.assert_close(v, critic(one.input_ids, one.position_ids)[0], atol=1e-5, rtol=0)
