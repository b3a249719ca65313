"""The report folder of ``compare``: ``summary.md``, ``modules.csv``, ``error_by_depth.png``, ``index.html``.

``index.html`` opens offline: the plot is embedded (base64), the tables are inline, nothing is
fetched from the network.
"""

from __future__ import annotations

import base64
import html
import math
import os
from collections.abc import Sequence
from typing import Any

from msprobe_hooks.analysis.results import (
    MEAN_NOT_THRESHOLDED,
    MODULE_COLUMNS,
    PAIR_RESULT_COLUMNS,
    THRESHOLD_OF,
    ModuleRow,
    PairResult,
    Status,
    Verdict,
)

PLOT = "error_by_depth.png"
# The pairs table of summary.md and index.html: the dump paths are long, they stay in pairs.csv and the details.
SUMMARY_COLUMNS = [
    "pair", "rule", "key", "mode", "verdict", "first_module", "first_io", "first_error", "max_error", "max_module",
    "compared", "unmatched", "not_comparable", "api_rows",
]  # fmt: skip


def _by_rule(r: PairResult, threshold: float) -> str:
    """Why ``r``'s first divergence is one, and what the fixed threshold says when it names another row."""
    if r.first_rule == "step":
        why = f"error {r.first_error:.3g}, a step up from {r.first_before:.3g} before it"
    else:
        why = f"error {r.first_error:.3g} > {threshold:g}"
    if (r.threshold_module, r.threshold_io) != (r.first_module, r.first_io):
        named = f"{r.threshold_module} {r.threshold_io}" if r.threshold_module else "nothing"
        why += f"; the fixed threshold {threshold:g} names {named}"
    return why


def overall(results: Sequence[PairResult], threshold: float) -> str:
    """One sentence: the earliest first divergence over all pairs, or the largest error seen."""
    diverging = [r for r in results if r.verdict is Verdict.DIVERGES]
    if diverging:
        earliest = min(diverging, key=lambda r: r.first_order)
        same = sum(r.first_module == earliest.first_module for r in diverging)
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


def summary_lines(results: Sequence[PairResult], threshold: float) -> list[str]:
    """What compare prints: one line overall, one per pair."""
    lines = [f"{len(results)} pairs: {overall(results, threshold)}"]
    for r in sorted(results, key=lambda r: r.pair):
        if r.verdict is Verdict.FAILED:
            lines.append(f"  pair {r.pair}: {Verdict.FAILED}: {r.message}")
        elif r.verdict is Verdict.DIVERGES:
            lines.append(
                f"  pair {r.pair} ({r.key}): {r.first_module} {r.first_io} diverges "
                f"({_by_rule(r, threshold)}); {r.compared} compared, {r.unmatched} unmatched"
            )
        else:
            largest = f"largest error {r.max_error:.3g} at {r.max_module}; " if r.max_error is not None else ""
            lines.append(
                f"  pair {r.pair} ({r.key}): {r.verdict}; {largest}{r.compared} compared, {r.unmatched} unmatched"
            )
    return lines


def _float(value: float) -> str:
    return f"{value:.3g}"


def _markdown_table(frame: Any) -> str:
    """A small DataFrame as a Markdown table (pandas' to_markdown needs tabulate, which msprobe does not bring)."""
    import pandas

    cells = frame.map(lambda v: "" if pandas.isna(v) else _float(v) if isinstance(v, float) else str(v))
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "---|" * len(frame.columns)
    return "\n".join([header, rule, *("| " + " | ".join(row) + " |" for row in cells.itertuples(index=False))])


def plot(rows: Any, results: Sequence[PairResult], threshold: float, path: str) -> None:
    """Error against depth (model order), one line per pair, each pair's first divergence marked."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    compared = rows[rows["status"] == Status.COMPARED.value]
    positions = {order: x for x, order in enumerate(sorted(compared["order"].unique()))}
    figure, axes = pyplot.subplots(figsize=(10, 4.5), dpi=100)
    floor = 1e-12  # exact zeros on a log axis
    for result in sorted(results, key=lambda r: r.pair):
        mine = compared[compared["pair"] == result.pair].sort_values("order")
        if mine.empty:
            continue
        xs = [positions[o] for o in mine["order"]]
        ys = [max(float(e), floor) for e in mine["error"]]
        (line,) = axes.plot(xs, ys, linewidth=1, label=f"pair {result.pair} ({result.key})")
        if result.verdict is Verdict.DIVERGES:
            x, y = positions[result.first_order], max(float(result.first_error), floor)
            axes.plot([x], [y], marker="o", markersize=9, color=line.get_color(), markeredgecolor="red")
            axes.annotate(f"{result.first_module} {result.first_io}", (x, y), textcoords="offset points",
                          xytext=(6, 6), fontsize=8, color="red")  # fmt: skip
    axes.axhline(threshold, color="red", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
    ticks: dict[str, int] = {}
    for order, layer, module in compared.sort_values("order")[["order", "layer", "module"]].itertuples(index=False):
        if layer is not None and not math.isnan(layer):
            ticks.setdefault(f"L{int(layer)}", positions[order])
        elif ticks:  # after the layers (the final norm); the embedding sits at the axis' start, unlabelled
            ticks.setdefault(module, positions[order])
    axes.set_xticks(list(ticks.values()), list(ticks.keys()), fontsize=8)
    axes.set_yscale("log")
    axes.set_xlabel("module (model order; ticks at each decoder layer's first compared tensor)")
    axes.set_ylabel(f"relative error (0 drawn at {floor:g})")
    axes.set_title("training forward vs inference prefill: error by depth")
    if len(results) <= 12:
        axes.legend(fontsize=8, loc="upper left")
    axes.grid(True, which="major", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)


def tables(results: Sequence[PairResult], rows: Sequence[ModuleRow]) -> tuple[Any, Any]:
    """``modules.csv`` and ``pairs.csv`` as DataFrames (columns: the fields of the row types).

    ``message`` (why a pair failed) is a column of ``pairs.csv`` only when some pair failed.
    """
    import pandas

    table = pandas.DataFrame([row.record() for row in rows], columns=list(MODULE_COLUMNS))
    table = table.sort_values(["pair", "order"], kind="stable")
    ordered = sorted(results, key=lambda r: r.pair)
    columns = [c for c in PAIR_RESULT_COLUMNS if c != "message" or any(r.message is not None for r in ordered)]
    return table, pandas.DataFrame([r.record() for r in ordered], columns=columns)


def write(folder: str, results: Sequence[PairResult], rows: Sequence[ModuleRow], threshold: float) -> str:
    """Write the report files into ``folder``; returns the path of ``index.html``."""
    os.makedirs(folder, exist_ok=True)
    table, pair_table = tables(results, rows)
    table.to_csv(os.path.join(folder, "modules.csv"), index=False)
    pair_table.to_csv(os.path.join(folder, "pairs.csv"), index=False)
    plot(table, results, threshold, os.path.join(folder, PLOT))

    headline = overall(results, threshold)
    ordered = sorted(results, key=lambda r: r.pair)
    failed = [r for r in ordered if r.verdict is Verdict.FAILED]
    counts = table["status"].value_counts().to_dict() if not table.empty else {}
    notes = [
        f"Threshold: relative error {threshold:g} {THRESHOLD_OF}; {MEAN_NOT_THRESHOLDED}.",
        "Rows: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ". Unmatched rows are never a pass.",
        "API rows (level mix: Functional./Tensor./Torch.) are counted per pair (training/inference) and kept out "
        "of the verdict: their call counters never line up across engines.",
    ]
    with open(os.path.join(folder, "summary.md"), "w", encoding="utf-8") as out:
        out.write(f"# compare: {len(results)} pairs\n\n**{headline}**\n\n")
        out.write("\n".join(f"- {n}" for n in notes) + "\n\n")
        out.write(_markdown_table(pair_table[SUMMARY_COLUMNS]) + "\n\n")
        for r in failed:
            out.write(f"- pair {r.pair}: {r.message}\n")
        out.write(f"\n![error by depth]({PLOT})\n\nEvery tensor, per pair: `modules.csv`. Dump paths: `pairs.csv`.\n")

    with open(os.path.join(folder, PLOT), "rb") as image:
        png = base64.b64encode(image.read()).decode()
    details = []
    for r in ordered:
        # not-comparable rows (parameters, rotary, ...) are many and the same in every pair: modules.csv has them
        shown = (table["pair"] == r.pair) & (table["status"] != Status.NOT_COMPARABLE.value)
        mine = table[shown].dropna(axis=1, how="all").drop(columns=["pair"], errors="ignore")
        body = (
            html.escape(r.message or "")
            if r.verdict is Verdict.FAILED
            else mine.to_html(index=False, na_rep="", float_format=_float)
        )
        details.append(
            f"<details><summary>pair {r.pair} ({html.escape(str(r.key))}): {html.escape(str(r.verdict))}"
            f"</summary><p>training: <code>{html.escape(r.train_dump)}</code><br>inference: "
            f"<code>{html.escape(r.generate_dump)}</code></p>{body}"
            "</details>"
        )
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>msprobe-hooks compare</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }} table {{ border-collapse: collapse; font-size: 12px; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; }} details {{ margin: 0.5em 0; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>Training forward vs inference prefill: {len(results)} pairs</h1>
<p><strong>{html.escape(headline)}</strong></p>
<ul>{"".join(f"<li>{html.escape(n)}</li>" for n in notes)}</ul>
<img id="plot" alt="error by depth" src="data:image/png;base64,{png}">
<h2>Pairs</h2>
{pair_table[SUMMARY_COLUMNS].to_html(index=False, na_rep="", float_format=_float)}
<h2>Compared and unmatched tensors, per pair</h2>
<p>The not-comparable ones, with the reason, are in <a href="modules.csv">modules.csv</a>.</p>
{"".join(details)}
<p>Files: <a href="summary.md">summary.md</a>, <a href="modules.csv">modules.csv</a>, <a href="pairs.csv">pairs.csv</a>,
<a href="{PLOT}">{PLOT}</a>.</p>
</body></html>
"""
    index = os.path.join(folder, "index.html")
    with open(index, "w", encoding="utf-8") as out:
        out.write(page)
    return index
