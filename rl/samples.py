"""A training sample: one trajectory's tokens, action mask, behaviour log-probs and reward.

What it is: `Sample`, the unit the learner consumes (it crosses the driver -> rank boundary),
and `sample_from_trajectory`, which builds one from an `agentcore` trajectory.
What it is not: packing into micro-batches (`rl/learner/packing.py`) or the PPO math (`rl/learner/ppo.py`).

Alignment, everywhere in `rl`: index i refers to token i of `token_ids`. The log-prob of token i
comes from the model output at position i-1, and the value used for action token i is the
critic output at position i-1 (the state before the action). Token 0 is never an action.

Example:
    sample = sample_from_trajectory(traj)   # traj.reward set by the reward stage
"""

from __future__ import annotations

from msgspec import Struct

from agentcore.types import Status, Trajectory


class Sample(Struct, frozen=True, kw_only=True):
    """One trajectory as token ids plus the per-token fields the loss needs."""

    sample_id: str
    group_id: str
    token_ids: list[int]
    """Prompt + response."""
    action_mask: list[int]
    """1 on model-generated tokens the loss applies to; 0 on prompt and tool-output tokens."""
    behaviour_logprobs: list[float]
    """Rollout engine log-prob of each token; 0.0 where action_mask is 0."""
    reward: float
    weight_version: int
    """Oldest policy version that generated any of the tokens."""
    truncated: bool = False
    demonstration: bool = False
    """A demonstration that a PPO update imitates (`PPOConfig.sft_coef`: rft's samples beside the
    rollouts) instead of scoring it; its reward and log-probs are not read."""

    @property
    def num_actions(self) -> int:
        return sum(self.action_mask)


_TRUNCATED = {Status.TRUNCATED_LENGTH, Status.TRUNCATED_TURNS, Status.TIMEOUT, Status.ABORTED}


def sample_from_trajectory(traj: Trajectory) -> Sample:
    """The sample of a scored trajectory; raises ValueError if it has no reward or bad lengths."""
    if traj.reward is None:
        raise ValueError(f"trajectory {traj.trajectory_id} has no reward")
    n = len(traj.response_ids)
    if len(traj.loss_mask) != n or len(traj.logprobs) != n:
        raise ValueError(
            f"trajectory {traj.trajectory_id}: response_ids, logprobs and loss_mask differ in length "
            f"({n}, {len(traj.logprobs)}, {len(traj.loss_mask)})"
        )
    if not traj.prompt_ids:
        raise ValueError(f"trajectory {traj.trajectory_id} has an empty prompt")
    prompt = len(traj.prompt_ids)
    # Tool-output tokens carry whatever the engine reported (often nothing); zero them so that
    # a masked position never holds a stray value.
    logprobs = [lp if m else 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask)]
    return Sample(
        sample_id=traj.trajectory_id,
        group_id=traj.group_id,
        token_ids=list(traj.prompt_ids) + list(traj.response_ids),
        action_mask=[0] * prompt + list(traj.loss_mask),
        behaviour_logprobs=[0.0] * prompt + logprobs,
        reward=float(traj.reward),
        weight_version=traj.weight_version_min,
        truncated=traj.status in _TRUNCATED,
    )
