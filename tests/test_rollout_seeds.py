"""Seeded rollouts: each trajectory of a group samples with its own seeds, reruns alike."""

from agentcore.rollout import TURN_STRIDE, turn_seed


def test_the_samples_of_a_group_get_different_seeds_and_reruns_the_same():
    a0, a1 = turn_seed(0, "task@3", 0, 0), turn_seed(0, "task@3", 1, 0)
    assert a0 != a1  # two samples of one task no longer draw the same tokens
    assert turn_seed(0, "task@3", 0, 0) == a0
    assert turn_seed(0, "task@4", 0, 0) != a0  # the next step's group samples afresh


def test_turns_of_a_trajectory_count_up_from_its_block():
    first = turn_seed(5, "g", 2, 0)
    assert [turn_seed(5, "g", 2, t) - first for t in range(3)] == [0, 1, 2]
    assert (first - 5) % TURN_STRIDE == 0 and 0 <= first < 2**31
