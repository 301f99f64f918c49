"""Export of the actor as a standalone Hugging Face model directory (rl.learner.checkpoint).

What it is: `export_hf(actor, tokenizer, out_dir)` - every rank gathers the actor's full state
(a collective), rank 0 writes config, safetensors, generation config and tokenizer under
`out_dir.tmp` and renames it into place, so a reader (`bench --watch`, SGLang) never sees half of
one. `_gather_export` / `_Export` split the gather from the write so that a background save can
write after the next training step has changed the actor. What it is not: a training checkpoint.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rl.learner.checkpoint_files import _barrier, _Clock, _rank, _replace_dir
from rl.learner.fsdp import full_state_items, hf_submodule

_EXPORT_BUCKET_BYTES = 256 << 20


def export_hf(
    actor: nn.Module,
    tokenizer: Any,
    out_dir: str | os.PathLike[str],
    *,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_size: str = "5GB",
    timings: dict[str, float] | None = None,
) -> Path:
    """Write the actor's HF model as a standalone Hugging Face directory; a collective.

    `tokenizer` is a tokenizer or a local tokenizer directory; `dtype` is the dtype the weights
    are stored in and the one `config.json` declares (SGLang serves bf16). The directory is
    assembled under `out_dir.tmp` and renamed into place, so a reader never sees half of it.
    Every rank gathers; rank 0 writes. `timings` receives seconds per part (export_gather,
    export_write, export_tokenizer, export_commit). Returns `out_dir`.
    """
    clock = _Clock(timings)
    job = _gather_export(actor, tokenizer, out_dir, dtype, max_shard_size)
    clock.lap("export_gather")
    if job is not None:
        job.write(clock)
    _barrier()
    return Path(out_dir)


class _Export:
    """The HF directory rank 0 writes, held apart from the live actor (a background save
    writes it after the training step that follows has changed the actor)."""

    def __init__(self, state: dict[str, torch.Tensor], hf: Any, tokenizer: Any, out_dir: Path,
                 dtype: torch.dtype, max_shard_size: str) -> None:
        self.state, self.tokenizer, self.out_dir, self.max_shard_size = state, tokenizer, out_dir, max_shard_size
        self.config = copy.deepcopy(hf.config)
        self.config.dtype = dtype
        self.generation_config = copy.deepcopy(hf.generation_config)

    def write(self, clock: _Clock) -> None:
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.config)
        _check_names(model, self.state)
        model.generation_config = self.generation_config
        tmp = self.out_dir.with_name(self.out_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, state_dict=self.state, max_shard_size=self.max_shard_size)
        clock.lap("export_write")
        _tokenizer(self.tokenizer).save_pretrained(tmp)
        clock.lap("export_tokenizer")
        _replace_dir(tmp, self.out_dir)
        clock.lap("export_commit")


def _gather_export(actor: nn.Module, tokenizer: Any, out_dir: str | os.PathLike[str], dtype: torch.dtype,
                   max_shard_size: str) -> _Export | None:
    """Every rank gathers the actor (a collective); rank 0 gets what it writes, the others None."""
    _, hf = hf_submodule(actor)
    if hf is None:
        raise ValueError("export_hf: the actor holds no transformers PreTrainedModel")
    state = _gather_cpu(actor, dtype)
    return _Export(state, hf, tokenizer, Path(out_dir), dtype, max_shard_size) if _rank() == 0 else None


def _gather_cpu(actor: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The actor's full HF state on CPU (rank 0; empty elsewhere), one copy per name: tied
    embeddings and lm_head are both stored (readers such as `bench --watch` expect every name)."""
    state: dict[str, torch.Tensor] = {}
    for bucket in full_state_items(actor, _EXPORT_BUCKET_BYTES, dtype=dtype):
        if _rank() == 0:
            state.update((name, t.to("cpu", copy=True)) for name, t in bucket)
    return state


def _check_names(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    expected = set(model.state_dict())
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise ValueError(f"export_hf: names differ from the HF model: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")


def _tokenizer(tokenizer: Any) -> Any:
    if isinstance(tokenizer, (str, os.PathLike)):
        from agentcore.tiny_tokenizer import (
            load_tokenizer,  # any local HF tokenizer directory
        )

        return load_tokenizer(tokenizer)
    return tokenizer
