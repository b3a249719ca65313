"""The report folder of ``compare``: ``summary.md``, ``modules.csv``, ``pairs.csv``, the figures, ``index.html``.

With decode pairs or log-prob gaps, also the symptom -> cause section: ``samples.csv`` (per sample its
gap, its first divergence at prefill and at the decode tokens, on which path) and
``decode_by_token.png``; with several global steps, the run section (``steps.csv``, ``run_by_step.png``).
``index.html`` opens offline: its figures are interactive (:mod:`.interactive`, plotly's bundle inlined),
the tables are inline, nothing is fetched from the network.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from typing import Any

from msprobe_hooks.analysis.answer import run_view
from msprobe_hooks.analysis.answer.assemble import Answer
from msprobe_hooks.analysis.answer.run_view import StepView
from msprobe_hooks.analysis.answer.symptom import SampleCause, path_verdict
from msprobe_hooks.analysis.report import interactive, routing
from msprobe_hooks.analysis.report.plots import Painter, decode_heatmap, decode_samples, depth, points, run_heatmap
from msprobe_hooks.analysis.results import (
    GAP_FIELDS,
    MEAN_NOT_THRESHOLDED,
    MODULE_COLUMNS,
    OPTIONAL_PAIR_COLUMNS,
    PAIR_RESULT_COLUMNS,
    SAMPLE_COLUMNS,
    STEP_COLUMNS,
    THRESHOLD_OF,
    FirstRule,
    PairKind,
    PairResult,
    SampleRow,
    Status,
    Verdict,
)
from msprobe_hooks.analysis.table import Table

PLOT = "error_by_depth.png"
DECODE_PLOT = "decode_by_token.png"
SAMPLES = "samples.csv"
STEPS = "steps.csv"
RUN_PLOT = "run_by_step.png"
REPORT_FILES = (
    "summary.md", "modules.csv", "pairs.csv", PLOT, SAMPLES, DECODE_PLOT, STEPS, RUN_PLOT, routing.ROUTING_CSV,
)  # fmt: skip
# The pairs table of summary.md and index.html: the dump paths are long, they stay in pairs.csv and the details.
SUMMARY_COLUMNS = [
    "pair", "rule", "key", "kind", "token_index", "mode", "verdict", "first_module", "first_io", "first_error",
    "max_error", "max_module",
    "compared", "unmatched", "not_comparable", "api_rows",
]  # fmt: skip


def _by_rule(r: PairResult, threshold: float) -> str:
    """Why ``r``'s first divergence is one, and what the fixed threshold says when it names another row."""
    if r.first_rule is FirstRule.ROUTING:
        return routing.describe(r)
    if r.first_rule is FirstRule.STEP:
        why = f"error {r.first_error:.3g}, a step up from {r.first_before:.3g} before it"
    else:
        why = f"error {r.first_error:.3g} > {threshold:g}"
    if (r.threshold_module, r.threshold_io) != (r.first_module, r.first_io):
        named = f"{r.threshold_module} {r.threshold_io}" if r.threshold_module else "nothing"
        why += f"; the fixed threshold {threshold:g} names {named}"
    return why + routing.noise_note(r)


def overall(results: Sequence[PairResult], threshold: float) -> str:
    """One sentence: the earliest first divergence over all pairs, or the largest error seen."""
    diverging = [r for r in results if r.verdict is Verdict.DIVERGES]
    if diverging:
        earliest = min(diverging, key=lambda r: r.first_order)
        same = sum(r.first_module == earliest.first_module for r in diverging)
        if earliest.first_rule is FirstRule.ROUTING:  # over every pair: the shares of one pair are few tokens
            named = sum(r.first_rule is FirstRule.ROUTING for r in diverging)
            return f"first divergence: {routing.headline(results)}; routing first in {named} of {len(results)} pairs"
        return (
            f"first divergence: {earliest.first_module} {earliest.first_io} "
            f"({_by_rule(earliest, threshold)}; first in {same} of {len(results)} pairs)"
        )
    measured = [r for r in results if r.max_error is not None]
    if measured:
        worst = max(measured, key=lambda r: r.max_error)
        where = f"{worst.max_module}, pair {worst.pair}"
        return f"{Verdict.NO_DIVERGENCE} {threshold:g} (largest error {worst.max_error:.3g} at {where})"
    return f"{Verdict.NOTHING_COMPARED}: no tensor of any pair could be compared"


def _pair_label(r: PairResult) -> str:
    return f"{r.key}, decode token {r.token_index}" if r.kind is PairKind.DECODE else str(r.key)


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


def pair_table(results: Sequence[PairResult]) -> Table:
    """``pairs.csv``, in pair order (columns: the fields of the result type).

    The optional columns (``message``: why a pair failed; the routing comparison's) are columns only when some pair
    has a value there.
    """
    ordered = sorted(results, key=lambda r: r.pair)
    columns = [
        c
        for c in PAIR_RESULT_COLUMNS
        if c not in OPTIONAL_PAIR_COLUMNS or any(getattr(r, c) not in (None, "") for r in ordered)
    ]
    return Table([r.record() for r in ordered], columns)


# The page shows each pair's tensors, and the depth figures draw its line, for this many pairs at most (a thousand
# pairs' tables are ~300 MB of HTML, more than a browser opens): the pairs that diverge or failed first, then the
# others, in pair order; modules.csv has all.
DETAILED_PAIRS = 200


def detailed_pairs(ordered: Sequence[PairResult]) -> list[PairResult]:
    """The pairs whose tensors the page lists (:data:`DETAILED_PAIRS` at most), in pair order."""
    if len(ordered) <= DETAILED_PAIRS:
        return list(ordered)
    clean_last = sorted(ordered, key=lambda r: r.verdict is Verdict.NO_DIVERGENCE)  # stable: pair order kept
    chosen = {r.pair for r in clean_last[:DETAILED_PAIRS]}
    return [r for r in ordered if r.pair in chosen]


def _left_out(ordered: Sequence[PairResult], detailed: Sequence[PairResult]) -> str:
    left = len(ordered) - len(detailed)
    if not left:
        return ""
    return f" Listed here: {len(detailed)} of {len(ordered)} pairs (the diverging and failed first); {left} more in it."


def summary_lines(found: Answer, threshold: float) -> list[str]:
    """What compare prints: one line overall, on which path (with decode pairs or gaps), the run (pairs of
    several global steps), one line per pair."""
    results = found.results
    lines = [f"{len(results)} pairs: {overall(results, threshold)}"]
    if found.samples:
        lines.append(path_verdict(found.samples))
    if found.steps:
        lines.append(run_view.run_verdict(found.steps))
    routed = routing.headline(results)  # MoE pairs only
    if routed:
        lines.append(routed)
    for r in sorted(results, key=lambda r: r.pair):
        if r.verdict is Verdict.FAILED:
            lines.append(f"  pair {r.pair}: {Verdict.FAILED}: {r.message}")
        elif r.verdict is Verdict.DIVERGES and r.first_rule is FirstRule.ROUTING:
            lines.append(
                f"  pair {r.pair} ({_pair_label(r)}): {routing.describe(r)}; "
                f"{r.compared} compared, {r.unmatched} unmatched"
            )
        elif r.verdict is Verdict.DIVERGES:
            lines.append(
                f"  pair {r.pair} ({_pair_label(r)}): {r.first_module} {r.first_io} diverges "
                f"({_by_rule(r, threshold)}); {r.compared} compared, {r.unmatched} unmatched"
            )
        elif r.verdict is Verdict.STATISTICS:
            lines.append(f"  pair {r.pair} ({_pair_label(r)}): {r.verdict}")
        else:
            largest = f"largest error {r.max_error:.3g} at {r.max_module}; " if r.max_error is not None else ""
            lines.append(
                f"  pair {r.pair} ({_pair_label(r)}): {r.verdict}; {largest}{r.compared} compared, "
                f"{r.unmatched} unmatched"
            )
    return lines


def _table_html(table: Table) -> str:
    return table.without_empty_columns().html()


def write(folder: str, found: Answer, threshold: float, painter: Painter | None = None) -> str:
    """Write the report files into ``folder`` (the PNGs by ``painter``, by default in this process); returns the
    path of ``index.html``."""
    painter = painter or Painter(separate_process=False)
    os.makedirs(folder, exist_ok=True)
    results = found.results
    found.store.write_csv(os.path.join(folder, "modules.csv"))
    pairs_table = pair_table(results)
    pairs_table.to_csv(os.path.join(folder, "pairs.csv"))
    ordered = sorted(results, key=lambda r: r.pair)
    detailed = detailed_pairs(ordered)
    rows = found.store.rows(r.pair for r in detailed)  # the only rows read back
    compared = points(rows)  # what the depth figure needs of the rows, all the painter's process is sent
    painter.draw(depth, compared, detailed, threshold, os.path.join(folder, PLOT))
    figures = [("plot", interactive.depth(rows, detailed, threshold))]
    sections = []  # (Markdown, HTML) of the symptom -> cause and run sections
    if found.samples:
        decode_figure = interactive.decode(found.store.layer_errors, found.samples)
        if decode_figure is not None:
            figures.append(("decode", decode_figure))
        sections.append(_symptom_section(folder, found, painter))
    if found.steps:
        figures.append(("run", interactive.run(found.steps)))
        sections.append(_run_section(folder, found.steps, painter))
    routed = routing.section(folder, results)  # MoE pairs only
    if routed is not None:
        sections.append((routed[0], ("routing", routed[1])))
    fragments = interactive.fragments(figures)

    headline = overall(results, threshold)
    failed = [r for r in ordered if r.verdict is Verdict.FAILED]
    counts = found.store.statuses
    notes = [
        f"Threshold: relative error {threshold:g} {THRESHOLD_OF}; {MEAN_NOT_THRESHOLDED}.",
        "Rows: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ". Unmatched rows are never a pass.",
        "API rows (level mix: Functional./Tensor./Torch.) are counted per pair (training/inference) and kept out "
        "of the verdict: their call counters never line up across engines.",
    ]
    with open(os.path.join(folder, "summary.md"), "w", encoding="utf-8") as out:
        out.write(f"# compare: {len(results)} pairs\n\n**{headline}**\n\n")
        out.write("\n".join(f"- {n}" for n in notes) + "\n\n")
        out.write(pairs_table.select(SUMMARY_COLUMNS).markdown() + "\n\n")
        for r in failed:
            out.write(f"- pair {r.pair}: {r.message}\n")
        out.write("".join(markdown for markdown, _ in sections))
        out.write(f"\n![error by depth]({PLOT})\n\nEvery tensor, per pair: `modules.csv`. Dump paths: `pairs.csv`.\n")

    details = []
    # not-comparable rows (parameters, rotary, ...) are many and the same in every pair: modules.csv has them
    shown: dict[Any, list[dict[str, Any]]] = {}  # pair -> its rows of the page
    for row in rows:
        if row.status is not Status.NOT_COMPARABLE:
            shown.setdefault(row.pair, []).append(row.record())
    for r in detailed:
        mine = Table(shown.get(r.pair, []), MODULE_COLUMNS).drop("pair")
        body = html.escape(r.message) if r.message is not None else _table_html(mine)
        details.append(
            f"<details><summary>pair {r.pair} ({html.escape(_pair_label(r))}): {html.escape(str(r.verdict))}"
            f"</summary><p>training: <code>{html.escape(r.train_dump)}</code><br>inference: "
            f"<code>{html.escape(r.generate_dump)}</code></p>{body}"
            "</details>"
        )
    left_out = _left_out(ordered, detailed)
    painter.finish()  # the PNGs are on disk before the page links them
    written = [f for f in REPORT_FILES if os.path.exists(os.path.join(folder, f))]
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>msprobe-hooks compare</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }} table {{ border-collapse: collapse; font-size: 12px; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; }} details {{ margin: 0.5em 0; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>Training forward vs inference: {len(results)} pairs</h1>
<p><strong>{html.escape(headline)}</strong></p>
<ul>{"".join(f"<li>{html.escape(n)}</li>" for n in notes)}</ul>
{fragments["plot"]}
{"".join(part.replace(FIGURE, fragments.get(name, "")) for _, (name, part) in sections)}
<h2>Pairs</h2>
{pairs_table.select(SUMMARY_COLUMNS).html()}
<h2>Compared and unmatched tensors, per pair</h2>
<p>The not-comparable ones, with the reason, are in <a href="modules.csv">modules.csv</a>.{left_out}</p>
{"".join(details)}
<p>Files: {", ".join(f'<a href="{f}">{f}</a>' for f in written)}.</p>
</body></html>
"""
    index = os.path.join(folder, "index.html")
    with open(index, "w", encoding="utf-8") as out:
        out.write(page)
    return index


FIGURE = "<!-- figure -->"  # where a section's interactive figure goes in its HTML


def _symptom_section(folder: str, found: Answer, painter: Painter) -> tuple[str, tuple[str, str]]:
    """``samples.csv`` written, its PNG drawn; the section's Markdown, and its HTML (figure ``decode``)."""
    samples = found.samples
    frame = sample_table(samples)
    frame.to_csv(os.path.join(folder, SAMPLES))
    shown = decode_samples(samples)
    if shown:  # the painter's process is sent the layer errors of the pairs it draws only
        drawn = {r.pair for s in shown for r in s.decode}
        layer_errors = {pair: found.store.layer_errors.get(pair, {}) for pair in drawn}
        painter.draw(decode_heatmap, layer_errors, samples, os.path.join(folder, DECODE_PLOT))
    verdict = path_verdict(samples)
    markdown = (
        f"\n## Symptom -> cause\n\n**{verdict}**\n\n"
        "Per sample: its log-prob gap to the rollout (`logprob_gap.jsonl`: max/mean |training - rollout| on the "
        "response tokens, the worst token `argmax`), the first divergence at prefill and at the decode tokens. "
        f"All of it: `{SAMPLES}`.\n\n{frame.without_empty_columns().markdown()}\n"
        + (f"\n![decode tokens by layer]({DECODE_PLOT})\n" if shown else "")
    )
    page = f"<h2>Symptom &rarr; cause</h2><p><strong>{html.escape(verdict)}</strong></p>{_table_html(frame)}{FIGURE}"
    return markdown, ("decode", page)


def _run_section(folder: str, views: Sequence[StepView], painter: Painter) -> tuple[str, tuple[str, str]]:
    """``steps.csv`` written, its PNG drawn; the section's Markdown, and its HTML (figure ``run``)."""
    Table([row.record() for row in run_view.tidy(views)], STEP_COLUMNS).to_csv(os.path.join(folder, STEPS))
    painter.draw(run_heatmap, views, os.path.join(folder, RUN_PLOT))
    verdict = run_view.run_verdict(views)
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
        f"\n## The run\n\n**{verdict}**\n\nPer global step: the verdict over its pairs, its first divergence, the "
        "largest error, and the token gap of its samples (verl's rollout_probs_diff_*, the log-prob gap). Every "
        f"scalar, per layer too: `{STEPS}` (and `compare --tensorboard DIR`).\n\n"
        f"{frame.without_empty_columns().markdown()}\n\n![the run]({RUN_PLOT})\n"
    )
    page = f"<h2>The run</h2><p><strong>{html.escape(verdict)}</strong></p>{_table_html(frame)}{FIGURE}"
    return markdown, ("run", page)
