"""Model FLOPs and MFU of one learner update, the figures behind `perf/tokens_per_s` and `perf/mfu`.

What it is: the FLOPs accounting that `python -m bench.system.learner` and the training loop share, so
the MFU printed while training is the MFU the benchmark measures. Per packed document of L tokens,
with l layers and q = heads x head_dim:
  dense      2 N L per forward, 6 N L per forward + backward; N counts the matmul weights a token
             goes through (decoder layers, plus the LM head for the actor, or the value head for
             the critic; embedding lookups are free);
  LM head    vocab x hidden of the actor's N, counted only for the `head_tokens` positions it runs
             on: with `ModelConfig.head_on_actions_only` (the default) the positions whose next
             token is an action (`action_positions`), else every token;
  attention  QK^T and AV, causal: 2 l q L^2 per forward, 6 l q L^2 forward + backward (document
             masking: each document attends only to itself, hence per document, not per row).
  update     ppo    (actor 6 N_a + critic 6 N_c per token, plus attention) x updates_per_batch,
                    plus the critic's no-grad value pass (2 N_c per token + attention);
             sft    the actor forward + backward;
             value  the critic's value pass, then its forward + backward.
MFU = global model FLOPs / (update seconds x peak bf16 dense FLOP/s per GPU x GPUs); MFU, not HFU:
activation-checkpoint and LM-head recomputation, and the KL reference's forward, are not counted.
What it is not: a profiler. Peaks are the data-sheet dense bf16 figures (no sparsity).

    flops = update_flops(hf_config, [len(s.token_ids) for s in samples], "ppo",
                         head_tokens=action_positions([s.action_mask for s in samples]))
    mfu = flops / (seconds * peak_flops("NVIDIA H100 80GB HBM3") * world_size)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Dense bf16 tensor-core peak per GPU, from the vendor data sheets; the first match wins.
PEAK_BF16_FLOPS = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM ("NVIDIA H100 80GB HBM3")
    ("A100", 312e12),
)
KINDS = ("ppo", "sft", "value")


def peak_flops(device_name: str, override_tflops: float | None = None) -> float | None:
    """Peak bf16 dense FLOP/s of one GPU by its name; None when unknown (CPU, unlisted GPU)."""
    if override_tflops:
        return override_tflops * 1e12
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in device_name), None)


def matmul_params(hf_config: dict[str, Any]) -> tuple[float, float]:
    """(N_actor, N_critic): matmul weights per token of the actor (with its LM head) and of the
    critic (with a value head of `hidden` weights instead)."""
    c = hf_config
    h, vocab = c["hidden_size"], c["vocab_size"]
    head_dim = c.get("head_dim") or h // c["num_attention_heads"]
    q_dim, kv_dim = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    per_layer = h * q_dim + 2 * h * kv_dim + q_dim * h + 3 * h * c["intermediate_size"]
    body = c["num_hidden_layers"] * per_layer
    return float(body + vocab * h), float(body + h)


def action_positions(action_masks: Sequence[Sequence[int]]) -> int:
    """Positions the actor's LM head runs on under head_on_actions_only: those whose next token is
    an action, i.e. the actions after each document's first token (`rl.learner.packing`'s position mask)."""
    return sum(sum(map(bool, mask)) - bool(mask[0]) for mask in action_masks if len(mask))


def update_flops(
    hf_config: dict[str, Any], doc_lengths: Sequence[int], kind: str, updates: int = 1,
    *, head_tokens: float | None = None,
) -> float:
    """Model FLOPs of one update of `kind` over documents of these lengths (module docstring);
    the actor's LM head counts for `head_tokens` positions (None: every token, the full head)."""
    if kind not in KINDS:
        raise ValueError(f"unknown update kind {kind!r}; have {KINDS}")
    n_actor, n_critic = matmul_params(hf_config)
    c = hf_config
    q = c["num_attention_heads"] * (c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
    tokens = float(sum(doc_lengths))
    head = float(c["vocab_size"] * c["hidden_size"])
    head_tokens = tokens if head_tokens is None else float(head_tokens)
    attn_fwd = 2.0 * c["num_hidden_layers"] * q * float(sum(n * n for n in doc_lengths))
    actor = 6.0 * (n_actor - head) * tokens + 6.0 * head * head_tokens + 3.0 * attn_fwd
    critic = 6.0 * n_critic * tokens + 3.0 * attn_fwd
    values = 2.0 * n_critic * tokens + attn_fwd
    if kind == "ppo":
        return (actor + critic) * updates + values
    if kind == "sft":
        return actor
    return values + critic


__all__ = ["KINDS", "PEAK_BF16_FLOPS", "action_positions", "matmul_params", "peak_flops", "update_flops"]
