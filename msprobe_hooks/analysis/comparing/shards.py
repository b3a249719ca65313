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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from msprobe_hooks.analysis.comparing.statistics import Stats, fuse

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
