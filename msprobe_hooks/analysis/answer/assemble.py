"""What ``compare`` found, put together: the pairs' verdicts, per sample the cause of its gap, per global step the run.

Nothing here writes a file: the report (:mod:`msprobe_hooks.analysis.report`) writes what this assembles.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from msprobe_hooks.analysis.answer import run_view
from msprobe_hooks.analysis.answer.diagnosis import Diagnosis, Evidence, diagnose
from msprobe_hooks.analysis.answer.run_view import StepView
from msprobe_hooks.analysis.answer.symptom import SampleCause, causes
from msprobe_hooks.analysis.comparing.logits import LogitsCheck
from msprobe_hooks.analysis.comparing.row_store import RowStore
from msprobe_hooks.analysis.results import PairKind, PairResult


@dataclass
class Answer:
    """What ``compare`` found: the pairs' verdicts and rows (on disk), and, where the pairs allow, per sample the
    cause of its gap (decode pairs, ``logprob_gap.jsonl``) and per global step the run (pairs of several steps);
    ``diagnosis``: what kind of cause (:mod:`.diagnosis`), from these, what the engines recorded (``evidence``) and the
    response tokens checked against the rollout's logits (``logits``)."""

    results: Sequence[PairResult]
    store: RowStore
    samples: list[SampleCause] = field(default_factory=list)
    steps: list[StepView] = field(default_factory=list)
    evidence: Evidence = field(default_factory=Evidence)
    logits: LogitsCheck | None = None

    @functools.cached_property
    def diagnosis(self) -> Diagnosis:
        return diagnose(self, evidence=self.evidence)


def assemble(
    results: Sequence[PairResult],
    store: RowStore,
    gaps: dict[tuple[str, Any], dict[str, Any]] | None = None,
    evidence: Evidence | None = None,
    logits: LogitsCheck | None = None,
) -> Answer:
    """The :class:`Answer` of ``results`` and their rows, with the training side's gap lines
    (:func:`.symptom.read_gaps`), diagnosed with what the engines recorded (``evidence``: :func:`.evidence.gather`)
    and the tokens checked against the rollout's logits (``logits``: :func:`..comparing.logits.check`).

    Results are put in pair order first: a pool returns them as they complete, and every tie (the largest error
    of equal pairs) must go the same way whatever the order."""
    results = sorted(results, key=lambda r: r.pair)
    gaps = gaps or {}
    decode = any(r.kind is PairKind.DECODE for r in results)
    samples = causes(results, gaps) if gaps or decode else []
    views = run_view.steps(results, store.layer_errors, gaps)
    steps = views if run_view.is_run(views) else []
    return Answer(results, store, samples, steps, evidence or Evidence(), logits)
