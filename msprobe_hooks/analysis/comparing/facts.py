"""The facts of a pair's compared rows the diagnosis reads (:class:`.results.RowFacts`): dtypes and integer rows.

Facts only: which dtypes each side dumped, and whether the integer tensors (the token ids) differ. What they mean is
decided in the answer stage (``analysis/answer/diagnosis.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from msprobe_hooks.analysis.results import ModuleRow, RowFacts, Status


def _floating(dtype: str | None) -> bool:
    return dtype is not None and "float" in dtype  # torch.float32, torch.bfloat16, torch.float8_e4m3fn, ...


def _integer(dtype: str | None) -> bool:
    return dtype is not None and "int" in dtype  # torch.int64 (the training side's ids), torch.int32 (vLLM's)


def of_rows(rows: Sequence[ModuleRow]) -> RowFacts | None:
    """The :class:`RowFacts` of a pair's rows; None when no row was compared."""
    # (name, error, training dtype, inference dtype) of each compared row: every one of them set there
    compared = [
        (f"{r.module} {r.io}", r.error, r.train_dtype, r.generate_dtype)
        for r in rows
        if r.status is Status.COMPARED and r.error is not None and r.train_dtype and r.generate_dtype
    ]
    if not compared:
        return None
    floating = [(name, (t, g)) for name, _, t, g in compared if _floating(t) and _floating(g)]
    facts = RowFacts(dtypes=dict(Counter(dtypes for _, dtypes in floating)))
    common = facts.common
    facts.other_dtypes = {name: dtypes for name, dtypes in floating if dtypes != common}
    facts.integer_rows = {name: error for name, error, t, g in compared if _integer(t) and _integer(g)}
    return facts
