"""The report's figures as data, each computed once: the page draws it (:mod:`.interactive`), the PNG of
``summary.md`` renders the same data (:mod:`.plots`), titles and axis labels included.

Plain values only (no matplotlib, no plotly): the painter's process is sent these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from msprobe_hooks.analysis.answer.run_view import StepView
from msprobe_hooks.analysis.answer.symptom import SampleCause
from msprobe_hooks.analysis.results import ModuleRow, PairResult, Status, Verdict

FLOOR = 1e-12  # exact zeros on a log axis
MOST_SAMPLES = 6  # panels of the decode heatmap: the samples with the largest gaps
LOG10_LOWEST = -8  # the heatmaps' colour scale starts here (log10 relative error)
GAPS = (("probs_diff_mean", "solid"), ("probs_diff_max", "dot"), ("token_gap_mean", "dash"))  # the run's gap lines


@dataclass(frozen=True)
class Mark:
    """A point marked on a figure (a first divergence): where, and what it is."""

    x: float
    y: float
    text: str


@dataclass(frozen=True)
class Line:
    """One pair's errors along the model, in model order."""

    label: str
    x: list[int]  # positions in model order
    y: list[float]
    where: list[tuple[str, str]]  # (module, input/output) of each point
    first: Mark | None  # its first divergence


@dataclass(frozen=True)
class Depth:
    """Error against depth (model order), a line per pair, each pair's first divergence marked."""

    lines: list[Line]
    ticks: list[tuple[int, str]]  # (position, module name): each decoder layer's first tensor, the modules outside
    threshold: float
    legend: bool
    title: str = "training forward vs inference: error by depth"
    x_title: str = "module (model order; a tick at each decoder layer's first compared tensor)"
    y_title: str = f"relative error (0 drawn at {FLOOR:g})"


@dataclass(frozen=True)
class Heatmap:
    """log10 of the largest error per decoder layer (y) and column (x), the first divergences marked (by index)."""

    title: str
    x: list[str]
    y: list[str]
    z: list[list[float | None]]  # z[y][x]; None: nothing compared there
    marks: list[Mark] = field(default_factory=list)


@dataclass(frozen=True)
class Decode:
    """Error by decode token and decoder layer, a heatmap per sample of :func:`decode_samples`."""

    panels: list[Heatmap]
    highest: float  # the colour scale's top, log10 (the largest error of the pairs drawn)
    title: str = "decode tokens: largest error per layer (dot: the first divergence)"
    x_title: str = "response token"
    colour_title: str = "log10 relative error"


@dataclass(frozen=True)
class GapLine:
    """One token-gap scalar over the global steps that have it."""

    name: str
    dash: str  # solid, dot, dash
    x: list[int]  # indices of the steps
    y: list[float]


@dataclass(frozen=True)
class Run:
    """The largest error per decoder layer and global step, each step's first divergence marked; the token gap
    per step below it."""

    heatmap: Heatmap
    gaps: list[GapLine]
    title: str = "the run: largest error per layer and global step (x: first divergence)"
    x_title: str = "global step"
    gap_title: str = "token gap"
    colour_title: str = "log10 relative error"


def _log10(error: float) -> float:
    return math.log10(max(error, FLOOR))


def _layer_label(layer: int) -> str:
    return f"L{layer}"


def depth(rows: Iterable[ModuleRow], results: Sequence[PairResult], threshold: float) -> Depth:
    """The depth figure of ``results``' pairs from their rows (the compared ones are drawn)."""
    by_pair: dict[int | None, list[ModuleRow]] = {}
    for row in sorted((r for r in rows if r.status is Status.COMPARED), key=lambda r: (r.pair, r.order)):
        by_pair.setdefault(row.pair, []).append(row)
    ordered = sorted({r.order for mine in by_pair.values() for r in mine})
    positions = {order: x for x, order in enumerate(ordered)}
    lines = []
    for result in sorted(results, key=lambda r: r.pair):
        mine = by_pair.get(result.pair)
        if not mine:
            continue
        label = f"pair {result.pair} ({result.key}" + (
            f", token {result.token_index})" if result.token_index is not None else ")"
        )
        first = None
        if result.verdict is Verdict.DIVERGES and result.first_order in positions:
            where = f"{result.first_module} {result.first_io}"
            first = Mark(positions[result.first_order], max(float(result.first_error), FLOOR), where)
        lines.append(
            Line(
                label,
                [positions[r.order] for r in mine],
                [max(float(r.error), FLOOR) for r in mine],
                [(r.module, r.io) for r in mine],
                first,
            )
        )
    ticks: dict[str, int] = {}  # a decoder layer by its name (layers.3), any other module by its own
    for row in sorted((r for mine in by_pair.values() for r in mine), key=lambda r: r.order):
        ticks.setdefault(f"layers.{row.layer}" if row.layer is not None else row.module, positions[row.order])
    return Depth(lines, [(x, name) for name, x in ticks.items()], threshold, legend=len(results) <= 12)


def decode_samples(samples: Sequence[SampleCause]) -> list[SampleCause]:
    """The samples the decode heatmap shows: those with a compared decode pair, the largest gaps first."""
    return [s for s in samples if any(r.compared for r in s.decode)][:MOST_SAMPLES]


def decode(layer_errors: Mapping[int, Mapping[int, float]], samples: Sequence[SampleCause]) -> Decode | None:
    """The decode heatmap of :func:`decode_samples` (``layer_errors``: per pair the largest error of each decoder
    layer, ``RowStore.layer_errors``); None when no sample has a compared decode pair."""
    shown = decode_samples(samples)
    if not shown:
        return None
    panels, top = [], 1e-6
    for sample in shown:
        pairs = [r for r in sample.decode if r.compared]
        errors = [layer_errors.get(r.pair, {}) for r in pairs]
        top = max([top, *(error for mine in errors for error in mine.values())])
        layers = sorted({layer for mine in errors for layer in mine})
        marks = []
        for x, r in enumerate(pairs):
            layer = r.first_layer if r.verdict is Verdict.DIVERGES else None
            if layer in layers:
                marks.append(Mark(x, layers.index(layer), f"{r.first_module} {r.first_io}"))
        panels.append(
            Heatmap(
                f"{sample.key} (step {sample.global_step})",
                [str(r.token_index) for r in pairs],
                [_layer_label(layer) for layer in layers],
                [[_log10(mine[layer]) if layer in mine else None for mine in errors] for layer in layers],
                marks,
            )
        )
    return Decode(panels, math.log10(top))


def run(views: Sequence[StepView]) -> Run:
    """The run figure of the global steps' views."""
    layers = sorted({layer for v in views for layer in v.layer_errors})
    marks = [
        Mark(x, layers.index(v.first_layer), f"{v.first.first_module} {v.first.first_io}")
        for x, v in enumerate(views)
        if v.first_layer is not None and v.first_layer in layers
    ]
    heatmap = Heatmap(
        "",
        [str(v.global_step) for v in views],
        [_layer_label(layer) for layer in layers],
        [[_log10(v.layer_errors[layer]) if layer in v.layer_errors else None for v in views] for layer in layers],
        marks,
    )
    gaps = []
    for name, dash in GAPS:
        xs = [x for x, v in enumerate(views) if name in v.gap]
        if xs:
            gaps.append(GapLine(name, dash, xs, [views[x].gap[name] for x in xs]))
    return Run(heatmap, gaps)
