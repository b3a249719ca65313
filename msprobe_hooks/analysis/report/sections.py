"""The report's sections after the pairs' verdict: each one record (:class:`Section`) that the writer lays out.

A builder takes the report folder and the answer, writes the section's tables and returns its record, or None
when the answer has nothing for it. The writer puts every section's verdict under the report's title, then
each section's Markdown and HTML (its figure after them: the PNG in ``summary.md``, the interactive one on the
page). The builders, in order, are ``writer.SECTIONS``; docs/development.md says how to add one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from msprobe_hooks.analysis.answer import run_view
from msprobe_hooks.analysis.answer.assemble import Answer
from msprobe_hooks.analysis.answer.symptom import SampleCause, path_verdict
from msprobe_hooks.analysis.report import figures, interactive, plots
from msprobe_hooks.analysis.results import GAP_FIELDS, SAMPLE_COLUMNS, STEP_COLUMNS, PairResult, SampleRow, Verdict
from msprobe_hooks.analysis.table import Table

SAMPLES = "samples.csv"
DECODE_PLOT = "decode_by_token.png"
STEPS = "steps.csv"
RUN_PLOT = "run_by_step.png"


@dataclass(frozen=True)
class Figure:
    """A figure of the report: its data (:mod:`.figures`, computed once) and its two renderers."""

    file: str  # the PNG, beside summary.md
    alt: str  # its text in summary.md
    data: Any
    png: Callable[[Any, str], None]  # :mod:`.plots`: (data, path), run by the painter
    page: Callable[[Any], Any]  # :mod:`.interactive`: data -> a plotly figure


@dataclass(frozen=True)
class Section:
    """One section of the report."""

    name: str  # its figure's id on the page
    verdict: str  # its headline line, under the report's title ("": none)
    files: tuple[str, ...]  # the tables it wrote into the report folder (its figure's PNG: the figure's)
    markdown: str  # its part of summary.md, from its heading on (paragraphs apart by a blank line, none after)
    html: str  # its part of index.html, from its heading on
    figure: Figure | None = None  # drawn after its Markdown and HTML


Builder = Callable[[str, Answer], Section | None]  # (report folder, answer) -> the section, its tables written


def table_html(table: Table) -> str:
    """A table on the page: without the columns that hold nothing."""
    return table.without_empty_columns().html()


def sample_table(samples: Sequence[SampleCause]) -> Table:
    """``samples.csv``: per sample its gap (``logprob_gap.jsonl``), the first divergence at prefill and at the
    decode tokens, and on which path."""

    def first(r: PairResult | None) -> str:
        if r is None or not r.compared:
            return "not compared"
        return f"{r.first_module} {r.first_io}" if r.verdict is Verdict.DIVERGES else "no divergence"

    rows = []
    for s in samples:
        decode = [r for r in s.decode if r.compared]
        diverging = s.decode_diverging
        gap = {f"gap_{name}": s.gap.get(name) for name in GAP_FIELDS}
        rows.append(
            SampleRow(
                request_id=s.key,
                global_step=s.global_step,
                **gap,
                prefill=first(s.prefill),
                decode_compared=len(decode),
                decode_diverging=len(diverging),
                first_decode_token=diverging[0].token_index if diverging else None,
                first_decode_divergence=first(diverging[0]) if diverging else ("no divergence" if decode else ""),
                path=s.path.value if s.path else "",
            )
        )
    return Table([row.record() for row in rows], SAMPLE_COLUMNS)


def symptom(folder: str, found: Answer) -> Section | None:
    """Symptom -> cause (decode pairs or log-prob gaps): ``samples.csv``, the decode heatmap."""
    if not found.samples:
        return None
    frame = sample_table(found.samples)
    frame.to_csv(os.path.join(folder, SAMPLES))
    drawn = figures.decode(found.store.layer_errors, found.samples)
    markdown = (
        "## Symptom -> cause\n\n"
        "Per sample: its log-prob gap to the rollout (`logprob_gap.jsonl`: max/mean |training - rollout| on the "
        "response tokens, the worst token `argmax`), the first divergence at prefill and at the decode tokens. "
        f"All of it: `{SAMPLES}`.\n\n{frame.without_empty_columns().markdown()}"
    )
    return Section(
        "decode",
        path_verdict(found.samples),
        (SAMPLES,),
        markdown,
        f"<h2>Symptom &rarr; cause</h2>{table_html(frame)}",
        Figure(DECODE_PLOT, "decode tokens by layer", drawn, plots.decode, interactive.decode) if drawn else None,
    )


def run(folder: str, found: Answer) -> Section | None:
    """The run (pairs of several global steps): ``steps.csv``, the run's heatmap."""
    views = found.steps
    if not views:
        return None
    Table([row.record() for row in run_view.tidy(views)], STEP_COLUMNS).to_csv(os.path.join(folder, STEPS))
    frame = Table(
        [
            {
                "global_step": v.global_step,
                "pairs": v.pairs,
                "verdict": v.verdict.value,
                "first_divergence": f"{v.first.first_module} {v.first.first_io}" if v.first else "",
                "first_error": v.first.first_error if v.first else None,
                "largest_error": v.largest.max_error if v.largest else None,
                **v.gap,
            }
            for v in views
        ]
    )
    markdown = (
        "## The run\n\nPer global step: the verdict over its pairs, its first divergence, the "
        "largest error, and the token gap of its samples (verl's rollout_probs_diff_*, the log-prob gap). Every "
        f"scalar, per layer too: `{STEPS}` (and `compare --tensorboard DIR`).\n\n"
        f"{frame.without_empty_columns().markdown()}"
    )
    return Section(
        "run",
        run_view.run_verdict(views),
        (STEPS,),
        markdown,
        f"<h2>The run</h2>{table_html(frame)}",
        Figure(RUN_PLOT, "the run", figures.run(views), plots.run, interactive.run),
    )
