"""One pair from its dumps to its packed rows: compared (``comparing``), judged (``answer``), packed for the report.

The one step that needs two stages, so it lives beside :mod:`.run`, outside them (a stage imports only the ones
before it). A pool's worker or a Ray task runs :func:`compare_packed` per pair, the rules handed in: a top-level
function and plain dataclasses, so that both pickle.
"""

from __future__ import annotations

from collections.abc import Sequence

from msprobe_hooks.analysis.answer.verdict import Rule, judge
from msprobe_hooks.analysis.comparing.compare import compare_pair
from msprobe_hooks.analysis.comparing.pool import Outcome
from msprobe_hooks.analysis.comparing.row_store import pack
from msprobe_hooks.analysis.pairing.pairs import Pair
from msprobe_hooks.analysis.results import ModuleRow, PairResult


def judged_pair(
    index: int, pair: Pair, rules: Sequence[Rule], mapping: str | None = None
) -> tuple[PairResult, list[ModuleRow]]:
    """One pair compared (:func:`.comparing.compare.compare_pair`) and judged by ``rules``: its result and rows."""
    result, rows = compare_pair(index, pair, mapping)
    judge(result, rows, rules)
    return result, rows


def compare_packed(index: int, pair: Pair, rules: Sequence[Rule], mapping: str | None = None) -> Outcome:
    """:func:`judged_pair`, its rows packed for the report."""
    result, rows = judged_pair(index, pair, rules, mapping)
    return result, pack(result.pair, rows)
