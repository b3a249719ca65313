"""Tensor-parallel shards: what an inference engine at TP = k dumps as one slice per rank, made whole again.

Every rank of a TP engine runs every prefill and dumps its own slice of the split tensors (the rule
table says which: ``parallel`` and ``shard_dim`` in ``name_map.yaml``, :class:`Sharding` here) and the
whole of the others. ``align`` gathers the dumps of one prefill from every rank of its engine
(:func:`engine_ranks`: the dispatch logs of the engine's workers list the same step); ``compare`` makes a
split tensor whole from them against a training side that holds it whole (FSDP), and compares rank by
rank against one sharded alike (Megatron TP), telling the two apart by element counts.

* Statistics: the whole is the concatenation of the slices, so its statistics follow exactly from
  theirs, by the algebra of fused parts (:func:`statistics.fuse`: max of maxes, min of mins,
  numel-weighted mean, root-sum-square of norms), which does not depend on the order of the slices.
* Tensors: the slices concatenate along ``shard_dim``. A column-parallel module of several parts holds
  a slice of each part on every rank (vLLM's and SGLang's ``qkv_proj`` per rank is
  ``[q_r | k_r | v_r]``, ``gate_up_proj`` ``[gate_r | up_r]``): the whole is part by part, ``[q_0 q_1 |
  k_0 k_1 | v_0 v_1]``, not rank by rank; the parts' sizes come from the training side's parts.

A model with fewer KV heads than TP ranks has its KV heads copied onto several ranks: their slices then
hold more elements than the whole, and the tensor is reported not comparable, never combined wrongly.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from msprobe_hooks.analysis.logs import GenStep
from msprobe_hooks.analysis.statistics import Stats, fuse

# A rule's ``parallel`` value -> the tensors of the module that are split across the ranks.
PARALLEL: dict[str, tuple[str, ...]] = {
    "column": ("output",),  # the output split (each rank a slice of every part); the input whole on every rank
    "row": ("input",),  # the input split; the output all-reduced, whole on every rank
    "both": ("input", "output"),  # a per-head module: both split alike
}


@dataclass(frozen=True)
class Sharding:
    """How one tensor is split across the ranks of a TP engine."""

    dim: int  # the dimension the slices are cut along, counted from the end (HF's [1, T, H] and vLLM's [T, H] alike)
    parts: int = 0  # the parts each rank's slice is made of (qkv_proj's output: 3, gate_up_proj's: 2); 0: one piece


class ShardError(ValueError):
    """Shards that do not make one whole tensor; the message says why (the row's reason)."""


def whole_shape(shapes: Sequence[Sequence[int]], dim: int) -> tuple[int, ...]:
    """The shape of the slices of ``shapes`` concatenated along ``dim``; ShardError when they do not fit."""
    first = tuple(shapes[0])
    if not first or len(first) < -dim:
        raise ShardError(f"a shard of shape {list(first)} has no dimension {dim}")
    rest = [tuple(s) for s in shapes]
    if any(
        len(s) != len(first) or s[:dim] != first[:dim] or s[len(s) + dim + 1 :] != first[len(first) + dim + 1 :]
        for s in rest
    ):
        raise ShardError(f"the ranks' shards differ outside dimension {dim}: {', '.join(map(str, map(list, rest)))}")
    whole = list(first)
    whole[dim] = sum(s[dim] for s in rest)
    return tuple(whole)


def whole_stats(shards: Sequence[Stats], dim: int) -> Stats:
    """The statistics of the whole tensor whose slices along ``dim`` are ``shards`` (one per rank), exactly."""
    shape = whole_shape([s.shape for s in shards], dim)
    return dataclasses.replace(fuse(shards), shape=shape)


def whole_tensor(shards: Sequence[Any], dim: int, part_sizes: Sequence[int] = ()) -> Any:
    """The whole tensor of ``shards`` (torch tensors, one per rank, in rank order) along ``dim``.

    ``part_sizes``: the sizes along ``dim`` of the whole's parts (``[q, k, v]``); each rank's slice then
    holds ``size / k`` of each, and the whole is made part by part. ShardError when they do not divide.
    """
    import torch

    if len(part_sizes) < 2:
        return torch.cat(list(shards), dim=dim)
    ranks = len(shards)
    if any(size % ranks for size in part_sizes):
        raise ShardError(f"parts of {list(part_sizes)} along dim {dim} do not split evenly over {ranks} ranks")
    per_rank = [size // ranks for size in part_sizes]
    if any(tensor.shape[dim] != sum(per_rank) for tensor in shards):
        raise ShardError(f"a rank's slice is not {' + '.join(map(str, per_rank))} along dim {dim}")
    pieces = [torch.split(tensor, per_rank, dim=dim) for tensor in shards]
    return torch.cat([torch.cat([rank[p] for rank in pieces], dim=dim) for p in range(len(part_sizes))], dim=dim)


# --- align: the ranks of one engine ----------------------------------------------------------------


class _HasStep(Protocol):
    @property
    def step(self) -> GenStep: ...


C = TypeVar("C", bound=_HasStep)


def _signature(step: GenStep) -> tuple[Any, ...]:
    """What every rank of one engine logs alike for one model step: its number, engine and packed rows."""
    rows = tuple((row.base, row.prompt_hash, row.tokens, row.offset, row.full) for row in step.rows)
    return step.step, step.engine, step.total_tokens, rows


def engine_ranks(chosen: C, candidates: Iterable[C]) -> list[C] | None:
    """The dumps of ``chosen``'s prefill on every rank of its engine, in rank order (``chosen`` among them).

    The workers of one TP engine run every model step together: each logs the step under the same
    number, with the same rows, in a log of its own (one per process). ``candidates`` are the prefill
    dumps of the request on any rank of any engine. None when a rank occurs twice among them (two
    replicas ran the request at the same step number): the ranks of ``chosen``'s engine cannot be told.
    """
    wanted = _signature(chosen.step)
    same = [c for c in candidates if _signature(c.step) == wanted and c.step.log != chosen.step.log]
    ranks = [chosen.step.rank] + [c.step.rank for c in same]
    if len(set(ranks)) != len(ranks):
        return None
    return sorted([chosen, *same], key=lambda c: -1 if c.step.rank is None else c.step.rank)


# --- which replica served a pair ---------------------------------------------------------------------


def workers(generate: Any) -> tuple[tuple[int | None, int | None], ...]:
    """(rank, pid) of every worker of the engine that ran a pair's prefill (a ``pairs.GenerateSide``).

    The engine (the replica) is known by its workers' processes: the one worker of a TP=1 engine, every
    rank's of a TP engine (``generate.shards``).
    """
    if generate.shards:
        return tuple((shard.rank, shard.pid) for shard in generate.shards)
    return ((generate.rank, generate.pid),)


def by_replica(pairs: Iterable[Any]) -> dict[tuple[tuple[int | None, int | None], ...], Counter[str]]:
    """Per replica (its :func:`workers`), how many pairs it served under each rank rule, in first-seen order."""
    found: dict[tuple[tuple[int | None, int | None], ...], Counter[str]] = {}
    for pair in pairs:
        found.setdefault(workers(pair.generate), Counter())[str(pair.rank_rule)] += 1
    return found


def replica_lines(pairs: Iterable[Any]) -> list[str]:
    """``align``'s lines on the replicas that served the pairs; none for one engine of one rank (TP=1 as before)."""
    found = by_replica(pairs)
    if len(found) < 2 and all(len(w) < 2 for w in found):
        return []
    lines = ["pairs by replica (the inference engine that ran the prefill: TP size, ranks and processes):"]
    for engine, rules in found.items():
        ranks = "+".join("?" if rank is None else str(rank) for rank, _ in engine)
        pids = "+".join("?" if pid is None else str(pid) for _, pid in engine)
        counts = ", ".join(f"{rule} {n}" for rule, n in rules.items())
        lines.append(
            f"  TP {len(engine)}, rank{'s' if len(engine) > 1 else ''} {ranks}, pid {pids}: "
            f"{sum(rules.values())} pairs (rank rule: {counts})"
        )
    return lines
