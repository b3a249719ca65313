"""The report folder of ``compare``: ``summary.md``, ``modules.csv``, ``pairs.csv``, the figures, ``index.html``,
``diagnosis.json``.

The answer first: ``summary.md`` and ``index.html`` open with the verdict lines (what kind of cause,
``cause: CAUSE (PATH): sentence`` from :mod:`msprobe_hooks.analysis.answer.diagnosis`; the first divergence over all
pairs; then each section's: on which path, since which global step, routing), then the notes, then the sections
(:mod:`.sections`, in :data:`SECTIONS` order: symptom -> cause with ``samples.csv`` and ``decode_by_token.png``,
the run with ``steps.csv`` and ``run_by_step.png``, routing with ``routing.csv``), then the pairs: the depth
figure and the table of every pair. ``index.html`` opens offline: its figures are interactive
(:mod:`.interactive`, plotly's bundle inlined), the tables are inline, nothing is fetched from the network.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from typing import Any

from msprobe_hooks.analysis.answer.assemble import Answer
from msprobe_hooks.analysis.answer.diagnosis import DIAGNOSIS_FILE
from msprobe_hooks.analysis.report import figures, interactive, plots, routing, sections
from msprobe_hooks.analysis.report.plots import Painter
from msprobe_hooks.analysis.report.sections import Builder, Figure, Section, table_html
from msprobe_hooks.analysis.results import (
    MEAN_NOT_THRESHOLDED,
    MODULE_COLUMNS,
    OPTIONAL_PAIR_COLUMNS,
    PAIR_RESULT_COLUMNS,
    THRESHOLD_OF,
    FirstRule,
    PairKind,
    PairResult,
    Status,
    Verdict,
)
from msprobe_hooks.analysis.table import Table

PLOT = "error_by_depth.png"
# The sections after the pairs' verdict, in the report's order: each one record (sections.Section).
SECTIONS: tuple[Builder, ...] = (sections.symptom, sections.run, routing.section)
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


def summary_lines(found: Answer, threshold: float, answer: Sequence[str]) -> list[str]:
    """What compare prints: the report's answer lines (:func:`verdict_lines`, as :func:`write` returned them: the
    cause, the first divergence over all pairs with their count, each section's verdict), then one line per pair."""
    results = found.results
    cause, first, *sections = answer
    lines = [cause, f"{len(results)} pairs: {first}", *sections]
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


def verdict_lines(found: Answer, threshold: float, built: Sequence[Section]) -> list[str]:
    """The report's answer, its first lines: the cause, the first divergence over all pairs, then each section's
    verdict."""
    return [found.diagnosis.line, overall(found.results, threshold), *(s.verdict for s in built if s.verdict)]


def write(folder: str, found: Answer, threshold: float, painter: Painter | None = None) -> tuple[str, list[str]]:
    """Write the report files into ``folder`` (the PNGs by ``painter``, by default in this process); returns the
    path of ``index.html`` and the report's answer lines (:func:`verdict_lines`)."""
    painter = painter or Painter(separate_process=False)
    os.makedirs(folder, exist_ok=True)
    results = found.results
    found.store.write_csv(os.path.join(folder, "modules.csv"))
    pairs_table = pair_table(results)
    pairs_table.to_csv(os.path.join(folder, "pairs.csv"))
    ordered = sorted(results, key=lambda r: r.pair)
    detailed = detailed_pairs(ordered)
    rows = found.store.rows(r.pair for r in detailed)  # the only rows read back
    depth = Figure(PLOT, "error by depth", figures.depth(rows, detailed, threshold), plots.depth, interactive.depth)
    built = [s for s in (build(folder, found) for build in SECTIONS) if s is not None]
    placed = [(s.name, s.figure) for s in built if s.figure is not None] + [("plot", depth)]  # in the page's order
    for _, figure in placed:  # the painter's process is sent each figure's data only
        painter.draw(figure.png, figure.data, os.path.join(folder, figure.file))
    fragments = interactive.fragments([(name, figure.page(figure.data)) for name, figure in placed])

    answer = verdict_lines(found, threshold, built)
    failed = [r for r in ordered if r.verdict is Verdict.FAILED]
    counts = found.store.statuses
    notes = [
        f"Threshold: relative error {threshold:g} {THRESHOLD_OF}; {MEAN_NOT_THRESHOLDED}.",
        "Rows: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ". Unmatched rows are never a pass.",
        "API rows (level mix: Functional./Tensor./Torch.) are counted per pair (training/inference) and kept out "
        "of the verdict: their call counters never line up across engines.",
    ]
    markdown = [
        f"# compare: {len(results)} pairs",
        *(f"**{line}**" for line in answer),
        "\n".join(f"- {n}" for n in notes),
    ]
    for section in built:
        markdown.append(section.markdown)
        if section.figure is not None:
            markdown.append(f"![{section.figure.alt}]({section.figure.file})")
    markdown += [
        f"## Pairs\n\n![{depth.alt}]({depth.file})",
        pairs_table.select(SUMMARY_COLUMNS).markdown(),
        *(["\n".join(f"- pair {r.pair}: {r.message}" for r in failed)] if failed else []),
        "Every tensor, per pair: `modules.csv`. Dump paths: `pairs.csv`.",
    ]
    with open(os.path.join(folder, "summary.md"), "w", encoding="utf-8") as out:
        out.write("\n\n".join(markdown) + "\n")
    with open(os.path.join(folder, DIAGNOSIS_FILE), "w", encoding="utf-8") as out:
        out.write(json.dumps(found.diagnosis.record(), indent=2, default=str) + "\n")

    details = []
    # not-comparable rows (parameters, rotary, ...) are many and the same in every pair: modules.csv has them
    shown: dict[Any, list[dict[str, Any]]] = {}  # pair -> its rows of the page
    for row in rows:
        if row.status is not Status.NOT_COMPARABLE:
            shown.setdefault(row.pair, []).append(row.record())
    for r in detailed:
        mine = Table(shown.get(r.pair, []), MODULE_COLUMNS).drop("pair")
        body = html.escape(r.message) if r.message is not None else table_html(mine)
        details.append(
            f"<details><summary>pair {r.pair} ({html.escape(_pair_label(r))}): {html.escape(str(r.verdict))}"
            f"</summary><p>training: <code>{html.escape(r.train_dump)}</code><br>inference: "
            f"<code>{html.escape(r.generate_dump)}</code></p>{body}"
            "</details>"
        )
    left_out = _left_out(ordered, detailed)
    painter.finish()  # the PNGs are on disk before the page links them
    written = ["summary.md", DIAGNOSIS_FILE, "modules.csv", "pairs.csv", PLOT]
    for section in built:
        written += [*section.files, *([section.figure.file] if section.figure is not None else [])]
    headlines = "\n".join(f"<p><strong>{html.escape(line)}</strong></p>" for line in answer)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>msprobe-hooks compare</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }} table {{ border-collapse: collapse; font-size: 12px; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; }} details {{ margin: 0.5em 0; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>Training forward vs inference: {len(results)} pairs</h1>
{headlines}
<ul>{"".join(f"<li>{html.escape(n)}</li>" for n in notes)}</ul>
{"".join(s.html + fragments.get(s.name, "") for s in built)}
<h2>Pairs</h2>
{fragments["plot"]}
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
    return index, answer
