"""Variable-length (packed) causal attention for the learner: the "varlen" attention of HF models.

What it is: an attention function registered with transformers under the name "varlen", for
packed rows ([1, T] holding several documents whose `position_ids` restart at 0). It calls
PyTorch's FlashAttention varlen kernel (`torch.nn.attention.varlen.varlen_attn`) with the
cumulative document lengths, so each document attends causally to itself only, no [T, T] mask is
ever built, no compute goes to padding or to other documents, and nothing is compiled (compiled
FlexAttention with document BlockMasks spent minutes per new shape in Inductor on the H100).
`packed_kwargs(position_ids)` gives the keyword arguments the model forward must receive
(transformers forwards them to every attention call); `varlen_available()` says whether this
torch has the kernel and a CUDA device to run it.

What it is not: a general attention (no padding masks, no KV cache: generation uses the
engine's own attention), or a CPU kernel: on CPU (and for fp32 on CUDA, which FlashAttention
does not take) the same function runs a per-document sdpa loop, which is what the CPU tests
compare against packed sdpa.

Example:
    register()                                    # once; rl.learner.models does it
    model = AutoModel.from_config(cfg, attn_implementation="varlen")
    hidden = model(input_ids=ids, position_ids=pos, attention_mask=None, use_cache=False,
                   **packed_kwargs(pos)).last_hidden_state
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.nn.functional as F

NAME = "varlen"
_registered = False


def varlen_available() -> bool:
    """True when torch ships the varlen FlashAttention kernel and CUDA is present."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def packed_kwargs(position_ids: torch.Tensor) -> dict[str, Any]:
    """cu_seq_lens / max_length of the documents of a packed [1, T] row (positions restart at 0)."""
    pos = position_ids[0]  # [T]
    starts = torch.nonzero(pos == 0).flatten()  # [D]
    total = torch.tensor([pos.shape[0]], device=pos.device, dtype=starts.dtype)
    cu = torch.cat([starts, total]).to(torch.int32)  # [D + 1]
    max_len = int((cu[1:] - cu[:-1]).max())  # one host sync per forward
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max_len, "max_length_k": max_len}


def _window_kwargs() -> dict[str, Any]:
    """Causal masking in whichever spelling this torch's varlen_attn accepts."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    return {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}


@functools.cache
def native_gqa() -> bool:
    """Whether this torch's varlen_attn takes fewer KV heads than query heads (`enable_gqa`), so
    the shared KV heads need no [T, Hq, D] copies in forward and no reduction of them in backward."""
    from torch.nn.attention.varlen import varlen_attn

    return "enable_gqa" in inspect.signature(varlen_attn).parameters


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, Hq, T, D]
    key: torch.Tensor,  # [1, Hkv, T, D]
    value: torch.Tensor,  # [1, Hkv, T, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns ([1, T, Hq, D], None)."""
    if cu_seq_lens_q is None or query.shape[0] != 1:
        raise ValueError("varlen attention needs one packed row and packed_kwargs(position_ids) in the forward call")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, H, D]
    flash = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)  # FlashAttention's dtypes
    gqa = k.shape[1] != q.shape[1]
    if gqa and not (flash and native_gqa()):  # expand the shared KV heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        gqa = False
    if flash:
        from torch.nn.attention.varlen import varlen_attn

        out = varlen_attn(
            q.contiguous(), k.contiguous(), v.contiguous(), cu_seq_lens_q, cu_seq_lens_q,
            max_length_q, max_length_q, scale=scaling, **_window_kwargs(), **({"enable_gqa": True} if gqa else {}),
        )  # [T, Hq, D]
    else:
        out = _per_document_sdpa(q, k, v, cu_seq_lens_q, scaling)
    return out.unsqueeze(0), None


def _per_document_sdpa(q, k, v, cu: torch.Tensor, scaling: float | None) -> torch.Tensor:
    """The reference: causal sdpa over each document separately; [T, H, D]."""
    bounds = cu.tolist()
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        qd, kd, vd = (t[start:end].transpose(0, 1) for t in (q, k, v))  # [H, L, D]
        outs.append(F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scaling).transpose(0, 1))
    return torch.cat(outs)


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """Mask factory for "varlen": document boundaries come from cu_seq_lens, never a mask."""
    return None


def register() -> None:
    """Make attn_implementation="varlen" known to transformers (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, varlen_attention)
    AttentionMaskInterface.register(NAME, _no_mask)
    _registered = True
