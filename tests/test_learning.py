"""The learning check (issue part 10): PPO, exactly as training runs it, raises the reward of a
toy task on a tiny random Qwen2 within a few dozen steps (CPU). The longer run with the reward
curve printed is `python -m bench.system.learning`."""

from __future__ import annotations

import torch

from bench.system.learning import LearningConfig, train


def test_ppo_raises_the_reward_of_a_toy_task():
    # Reward = fraction of the 8 generated tokens equal to a target token (1/16 by chance).
    # Seeds 0-7 all went from ~0.08 over the first 5 steps to 0.44-0.56 over the last 5.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small only loses time to intra-op threads
    try:
        curve = train(LearningConfig(steps=30, batch=32, seed=0))
    finally:
        torch.set_num_threads(threads)
    first, last = sum(curve[:5]) / 5, sum(curve[-5:]) / 5
    assert first < 0.15
    assert last > first + 0.25, [round(r, 3) for r in curve]


def test_ppo_at_a_rollout_temperature_below_one_raises_the_reward_of_the_distribution_it_sampled():
    # Sampling at 0.7 and PPO's policy at 0.7: the learner scores the tokens as the sampler drew them
    # (the log-prob gap ~1e-7; with the learner at temperature 1 it was 0.26-0.30, seeds 0-3).
    # Seeds 0-3 went from 0.07-0.10 over the first 3 steps to 0.75-0.87 over the last 3.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    gaps = []
    try:
        curve = train(LearningConfig(steps=30, batch=32, seed=1, temperature=0.7),
                      log=lambda step, reward, m: gaps.append(m["logprob_gap"]))
    finally:
        torch.set_num_threads(threads)
    first, last = sum(curve[:5]) / 5, sum(curve[-5:]) / 5
    assert first < 0.15
    assert last > first + 0.25, [round(r, 3) for r in curve]
    assert max(gaps) < 1e-4
