"""The facts of a pair's compared rows the diagnosis reads (:class:`.results.RowFacts`): dtypes and integer rows.

Facts only: which dtypes each side dumped, and whether the integer tensors (the token ids) differ. What they mean is
decided in the answer stage (``analysis/answer/diagnosis.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from msprobe_hooks.analysis.results import ModuleRow, RowFacts, Status


def _floating(dtype: str | None) -> bool:
    return bool(dtype) and "float" in dtype  # torch.float32, torch.bfloat16, torch.float8_e4m3fn, ...


def _integer(dtype: str | None) -> bool:
    return bool(dtype) and "int" in dtype  # torch.int64 (the training side's ids), torch.int32 (vLLM's)


def of_rows(rows: Sequence[ModuleRow]) -> RowFacts | None:
    """The :class:`RowFacts` of a pair's rows; None when no row was compared."""
    compared = [r for r in rows if r.status is Status.COMPARED and r.error is not None]
    if not compared:
        return None
    floating = [r for r in compared if _floating(r.train_dtype) and _floating(r.generate_dtype)]
    facts = RowFacts(dtypes=dict(Counter((r.train_dtype, r.generate_dtype) for r in floating)))  # type: ignore[misc]
    common = facts.common
    facts.other_dtypes = {
        f"{r.module} {r.io}": (r.train_dtype, r.generate_dtype)  # type: ignore[misc]
        for r in floating
        if (r.train_dtype, r.generate_dtype) != common
    }
    facts.integer_rows = {
        f"{r.module} {r.io}": r.error  # type: ignore[misc]
        for r in compared
        if _integer(r.train_dtype) and _integer(r.generate_dtype)
    }
    return facts
