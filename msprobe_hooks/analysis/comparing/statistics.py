"""msprobe's per-tensor statistics: reading them, combining the parts of a fused output, comparing.

A fused inference module (vLLM's ``qkv_proj``, ``gate_up_proj``) outputs the concatenation of
what several training modules output. The statistics of a concatenation follow exactly from the
parts' statistics: max of maxes, min of mins, numel-weighted mean, root-sum-square of norms; and
they do not depend on the order of the parts (Megatron interleaves q, k, v per query group).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from msprobe_hooks.analysis.results import THRESHOLDED

# msprobe's names of a tensor entry's statistics, in the order of Stats' fields max, min, mean, norm
DUMPED_STATISTICS = ("Max", "Min", "Mean", "Norm")


def number(value: Any) -> float | None:
    """A statistic as msprobe wrote it (a number, "inf"/"nan" strings, null), as a float or None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Stats:
    """One dumped tensor's statistics (or a fused combination of several)."""

    shape: tuple[int, ...]
    dtype: str
    max: float | None
    min: float | None
    mean: float | None
    norm: float | None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def flat_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """``[1, T, H]`` and ``[T, H]`` alike as ``(T, H)``: rows of the last dimension (batch 1 squeezed)."""
    if not shape:
        return ()
    last = shape[-1]
    return (math.prod(shape) // last if last else 0, last)


def fuse(parts: Sequence[Stats]) -> Stats:
    """The statistics of the concatenation of ``parts`` along the last dimension, exactly.

    A statistic missing in any part is missing in the result. The parts must agree on every
    dimension but the last (the fused module's rows); the result has the summed last dimension.
    """
    first = parts[0]
    rows = flat_shape(first.shape)[:1]
    shape = (*rows, sum(flat_shape(p.shape)[-1] for p in parts)) if first.shape else ()

    def all_of(values: list[float | None]) -> list[float] | None:
        present = [v for v in values if v is not None]
        return present if len(present) == len(values) else None

    maxes = all_of([p.max for p in parts])
    mins = all_of([p.min for p in parts])
    means = all_of([p.mean for p in parts])
    norms = all_of([p.norm for p in parts])
    total = sum(p.numel for p in parts)
    return Stats(
        shape=shape,
        dtype=first.dtype if all(p.dtype == first.dtype for p in parts) else "mixed",
        max=max(maxes) if maxes else None,
        min=min(mins) if mins else None,
        mean=sum(m * p.numel for m, p in zip(means, parts, strict=True)) / total if means and total else None,
        norm=math.sqrt(sum(n * n for n in norms)) if norms else None,
    )


def relative_error(train: float | None, generate: float | None) -> float | None:
    """``|train - generate| / |generate|`` (0 when both are 0, inf when only the inference one is)."""
    if train is None or generate is None:
        return None
    if math.isnan(train) or math.isnan(generate):
        return None if math.isnan(train) and math.isnan(generate) else math.inf
    diff = abs(train - generate)
    if diff == 0:
        return 0.0
    return diff / abs(generate) if generate else math.inf


def statistic_errors(train: Stats, generate: Stats) -> dict[str, float | None]:
    """The relative error of each statistic, keyed ``max``, ``min``, ``mean``, ``norm``."""
    return {
        name: relative_error(getattr(train, name), getattr(generate, name)) for name in ("max", "min", "mean", "norm")
    }


def thresholded_error(errors: Mapping[str, float | None]) -> float | None:
    """The largest relative error among the thresholded statistics; None when none could be computed."""
    values = [value for name in THRESHOLDED if (value := errors.get(name)) is not None]
    return max(values) if values else None


def tensor_errors(train: Any, generate: Any) -> dict[str, float]:
    """Element-wise comparison of two tensors of the same layout (torch tensors, any shape, same numel).

    ``relative`` is ``||train - generate|| / ||generate||``: the tensor-mode counterpart of the
    norm's relative error, and the number the verdict is taken on.
    """
    import torch

    a = train.detach().reshape(-1).to(torch.float64)
    b = generate.detach().reshape(-1).to(torch.float64)
    diff = a - b
    b_norm = float(torch.linalg.vector_norm(b))
    d_norm = float(torch.linalg.vector_norm(diff))
    denominator = float(torch.linalg.vector_norm(a)) * b_norm
    return {
        "cosine": float(torch.dot(a, b)) / denominator if denominator else (1.0 if d_norm == 0 else 0.0),
        "max_abs": float(diff.abs().max()) if diff.numel() else 0.0,
        "relative": (d_norm / b_norm if b_norm else (0.0 if d_norm == 0 else math.inf)),
    }
