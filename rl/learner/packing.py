"""Packing samples into micro-batches: several documents in one [1, T] row, no padding.

What it is: `pack` (bins under a token budget: first-fit decreasing, improved by a bounded search), `MicroBatch` (the tensors
of one packed row, position-indexed), `collate` / `micro_batches` (samples -> MicroBatch),
`dummy_micro_batch` (an all-masked row that keeps FSDP collectives in step across ranks) and
`balance` (a rank's share of the global batch, balanced by tokens).
What it is not: the model call or the loss (`rl/learner/update.py`).

Index spaces. Per-sample fields are token-indexed (entry i belongs to token i, see
`rl/samples.py`). A MicroBatch is position-indexed: position t carries what the model output at
t is used for, namely the action token t+1 of the same document. So `targets[t]` is token t+1,
`mask[t]` is the action mask of token t+1, and `advantages[t]`, `returns[t]`,
`old_logprobs[t]`, `behaviour_logprobs[t]` belong to token t+1; `old_values[t]` is the critic
output at t, the value of the state before token t+1. The last position of each document has
target 0 and mask 0. `to_positions` / `to_tokens` convert one document between the two spaces.

Example:
    for mb in micro_batches(samples, token_budget=16384, fields={"advantages": advs}):
        mb = mb.to(device)
        logprobs, entropy = actor(mb.input_ids, mb.position_ids, mb.targets)   # [1, T]
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

import torch

from rl.samples import Sample

log = logging.getLogger("cuda-agent.packing")

SEARCH_MAX_ITEMS = 256
"""Above this many documents `pack` keeps first-fit decreasing (the search recurses per document)."""
FIELDS = ("old_logprobs", "behaviour_logprobs", "ref_logprobs", "advantages", "returns", "old_values")
"""Optional position-indexed float fields of a MicroBatch."""


def pack(lengths: Sequence[int], token_budget: int, *, search_nodes: int = 20_000) -> list[list[int]]:
    """Indices into bins of total length <= token_budget: first-fit decreasing, then, when that
    takes more bins than the lower bound ceil(total / budget), a bounded depth-first search for
    a packing into fewer (each bin is a micro-batch: fewer, fuller rows cost less per token).
    Deterministic; the search gives up after `search_nodes` placements and keeps what it has.

    A document longer than the budget (a trajectory can grow to `rollout.max_context_tokens`)
    gets a bin of its own, first: the budget is what packing aims at, not a reason to drop data.
    Peak memory then follows the longest trajectory."""
    if token_budget < 1:
        raise ValueError(f"token budget must be >= 1, got {token_budget}")
    over = [i for i, n in enumerate(lengths) if n > token_budget]
    if over:
        rest = [i for i, n in enumerate(lengths) if n <= token_budget]
        packed = pack([lengths[i] for i in rest], token_budget, search_nodes=search_nodes)
        return [[i] for i in over] + [[rest[j] for j in b] for b in packed]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(token_budget - lengths[i])
    if len(order) > SEARCH_MAX_ITEMS:  # many short documents: first-fit decreasing is near the bound
        return bins
    nodes = [search_nodes]
    for k in range(-(-sum(lengths) // token_budget), len(bins)):
        found = _pack_into(k, order, lengths, token_budget, nodes)
        if found is not None:
            return found
    return bins


def _pack_into(k: int, order: list[int], lengths: Sequence[int], budget: int, nodes: list[int]) -> list[list[int]] | None:
    """Items (longest first) into at most k bins by depth-first search, or None (none found
    before the shared placement budget `nodes[0]` ran out). Bins with equal room are
    interchangeable: only the first of them is tried."""
    bins: list[list[int]] = [[] for _ in range(k)]
    room = [budget] * k
    left = [0] * (len(order) + 1)  # tokens of order[j:]
    for j in range(len(order) - 1, -1, -1):
        left[j] = left[j + 1] + lengths[order[j]]

    def place(j: int) -> bool:
        if j == len(order):
            return True
        if left[j] > sum(room):
            return False
        n, tried = lengths[order[j]], set()
        for b in range(k):
            if room[b] < n or room[b] in tried:
                continue
            if nodes[0] <= 0:
                return False
            nodes[0] -= 1
            tried.add(room[b])
            bins[b].append(order[j])
            room[b] -= n
            if place(j + 1):
                return True
            room[b] += n
            bins[b].pop()
        return False

    return [b for b in bins if b] if place(0) else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class MicroBatch:
    """One packed row of documents (position-indexed; see the module docstring)."""

    input_ids: torch.Tensor  # [1, T] int64
    position_ids: torch.Tensor  # [1, T] int64, 0 at each document start
    targets: torch.Tensor  # [1, T] int64, next token within the document, 0 at its end
    mask: torch.Tensor  # [1, T] float32, 1 where targets[t] is an action token
    sample_index: list[int]
    """Index (into the packed sample list) of each document, in row order; empty for a dummy."""
    doc_lengths: list[int]
    """Tokens of each document, in row order."""
    old_logprobs: torch.Tensor | None = None  # [1, T] fp32 each
    behaviour_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    @property
    def num_action_tokens(self) -> int:
        return int(self.mask.sum().item())

    def replace(self, **changes: torch.Tensor | None) -> MicroBatch:
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device | str) -> MicroBatch:
        moved = {
            f.name: v.to(device, non_blocking=True)
            for f in dataclasses.fields(self)
            if isinstance(v := getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)

    def split(self, x: torch.Tensor) -> list[torch.Tensor]:
        """A position-indexed [1, T] tensor cut into one 1-D tensor per document."""
        return list(torch.split(x[0], self.doc_lengths))


def to_positions(x: torch.Tensor) -> torch.Tensor:
    """One document's token-indexed [n] -> position-indexed [n]: out[t] = x[t+1], out[n-1] = 0."""
    return torch.cat([x[1:], x.new_zeros(1)])


def to_tokens(x: torch.Tensor) -> torch.Tensor:
    """One document's position-indexed [n] -> token-indexed [n]: out[i] = x[i-1], out[0] = 0."""
    return torch.cat([x.new_zeros(1), x[:-1]])


def collate(
    samples: Sequence[Sample],
    indices: Sequence[int],
    fields: Mapping[str, Sequence[torch.Tensor]] | None = None,
) -> MicroBatch:
    """The MicroBatch of samples[i] for i in indices; `fields` maps a FIELDS name to per-sample
    token-indexed tensors (indexed like `samples`). behaviour_logprobs come from the samples."""
    fields = dict(fields or {})
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown micro-batch fields {sorted(unknown)}; known: {FIELDS}")
    fields.setdefault("behaviour_logprobs", [torch.tensor(s.behaviour_logprobs) for s in samples])
    docs = [samples[i] for i in indices]
    ids = [torch.tensor(s.token_ids, dtype=torch.long) for s in docs]
    values = {
        name: torch.cat([to_positions(per_sample[i].float().cpu()) for i in indices])[None]
        for name, per_sample in fields.items()
    }
    return MicroBatch(
        input_ids=torch.cat(ids)[None],
        position_ids=torch.cat([torch.arange(len(x)) for x in ids])[None],
        targets=torch.cat([to_positions(x) for x in ids])[None],
        mask=torch.cat([to_positions(torch.tensor(s.action_mask, dtype=torch.float32)) for s in docs])[None],
        sample_index=list(indices),
        doc_lengths=[len(x) for x in ids],
        **values,
    )


def micro_batches(
    samples: Sequence[Sample],
    token_budget: int,
    fields: Mapping[str, Sequence[torch.Tensor]] | None = None,
) -> list[MicroBatch]:
    """All samples packed into micro-batches of at most `token_budget` tokens (a longer sample:
    a micro-batch of its own, logged)."""
    lengths = [len(s.token_ids) for s in samples]
    over = [n for n in lengths if n > token_budget]
    if over:
        log.warning("%d sample(s) longer than the micro-batch budget of %d tokens (longest %d) train in "
                    "micro-batches of their own", len(over), token_budget, max(over))
    bins = pack(lengths, token_budget)
    return [collate(samples, b, fields) for b in bins]


def dummy_micro_batch(fields: Sequence[str] = ()) -> MicroBatch:
    """A two-token row with mask 0 everywhere and zeros in behaviour_logprobs and the named FIELDS.

    A rank with fewer micro-batches than its peers runs these so every rank issues the same FSDP
    collectives; its loss is an exact zero that still reaches every parameter.
    """
    zeros = torch.zeros(1, 2, dtype=torch.long)
    return MicroBatch(
        input_ids=zeros,
        position_ids=torch.arange(2)[None],
        targets=zeros.clone(),
        mask=torch.zeros(1, 2),
        sample_index=[],
        doc_lengths=[2],
        **{name: torch.zeros(1, 2) for name in {"behaviour_logprobs", *fields}},
    )


def balance(samples: Sequence[Sample], world_size: int, rank: int) -> list[Sample]:
    """This rank's share of the global batch: longest first onto the least-loaded rank.

    Deterministic (ties go to the lower index and the lower rank), so every rank computes the
    same assignment from the same list; each sample goes to exactly one rank, in original order.
    """
    load = [0] * world_size
    owner = [0] * len(samples)
    for i in sorted(range(len(samples)), key=lambda i: (-len(samples[i].token_ids), i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += len(samples[i].token_ids)
    return [s for s, r in zip(samples, owner) if r == rank]
