"""Where a pair's computations part: the two rules that name a pair's first divergence.

Both read the compared rows of a pair in the training model's order (:class:`.results.ModuleRow`,
``error`` = the relative error of max/min/norm, or ``||a - b|| / ||b||`` in tensor mode):

* :class:`StepRule` (the primary one): the first row whose error **steps up** against the pair's own
  noise floor, i.e. exceeds both an absolute floor and ``factor`` times the largest error of every
  earlier row. The floor follows the coarser of the two dtypes (``units`` unit roundoffs: bf16
  computations differ by ~1e-2 for the same maths, fp32 by ~1e-6), never below ``minimum``. A fault
  stands out against what came before it even when it is small (a 3 % change of ``up_proj`` is 1.4 %
  of the fused ``gate_up_proj`` statistics) and noise that grows smoothly with depth does not.
* :class:`FixedRule` (``--threshold``): the first row whose error exceeds a fixed threshold.

When the two name different rows, the report says both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from msprobe_hooks.analysis.results import DEFAULT_THRESHOLD, ModuleRow, Status

# Unit roundoff (half an ulp at 1.0) of the floating dtypes msprobe writes, by the names it writes them.
UNIT_ROUNDOFF = {
    "torch.float64": 2.0**-53,
    "torch.float32": 2.0**-24,
    "torch.float16": 2.0**-11,
    "torch.bfloat16": 2.0**-8,
}


def unit_roundoff(*dtypes: str | None) -> float:
    """The coarsest unit roundoff among ``dtypes`` (fp32's when none is a known float dtype)."""
    known = [UNIT_ROUNDOFF[d] for d in dtypes if d in UNIT_ROUNDOFF]
    return max(known, default=UNIT_ROUNDOFF["torch.float32"])


def _compared(rows: Sequence[ModuleRow]) -> list[ModuleRow]:
    return [r for r in rows if r.status is Status.COMPARED and r.error is not None]


@dataclass(frozen=True)
class FixedRule:
    """A row diverges when its error exceeds ``threshold``."""

    threshold: float = DEFAULT_THRESHOLD

    def first(self, rows: Sequence[ModuleRow]) -> ModuleRow | None:
        return next((r for r in _compared(rows) if r.error > self.threshold), None)


@dataclass(frozen=True)
class StepRule:
    """A row diverges when its error exceeds its floor and ``factor`` times every earlier row's error.

    The floor of a row is ``max(minimum, units * unit_roundoff(train dtype, inference dtype))``: 1e-4
    for fp32, 1.6e-2 for bf16. Measured on real pairs (docs/analysis.md, "The verdict"): identical
    weights, fp32 on both sides, errors <= 1.3e-6 everywhere; vLLM in bf16 against fp32 training, errors
    grow smoothly with depth to ~1.2e-2, no row above the floor more than 1.7x the largest before it;
    planted changes of 1-5 % (fp32) and 2-5 % (bf16), fused or not, 2.2x-10^5x.
    """

    factor: float = 2.0
    units: float = 4.0
    minimum: float = 1e-4

    def floor(self, row: ModuleRow) -> float:
        return max(self.minimum, self.units * unit_roundoff(row.train_dtype, row.generate_dtype))

    def steps(self, rows: Sequence[ModuleRow]) -> list[tuple[ModuleRow, bool]]:
        """Each compared row, in order, and whether it steps up."""
        out, largest = [], 0.0
        for row in _compared(rows):
            out.append((row, row.error > max(self.floor(row), self.factor * largest)))
            largest = max(largest, row.error)
        return out

    def first(self, rows: Sequence[ModuleRow]) -> ModuleRow | None:
        return next((row for row, up in self.steps(rows) if up), None)
