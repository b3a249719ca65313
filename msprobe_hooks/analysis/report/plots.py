"""The report's figures (matplotlib, PNG): error against depth per pair, error by decode token and layer,
the run by global step; drawn by a :class:`Painter`.

PNG keeps ``summary.md`` readable anywhere (``index.html`` has the interactive versions of
:mod:`.interactive`). The figures read the result types, not a DataFrame, so the painter's process
needs matplotlib alone.
"""

from __future__ import annotations

import math
import multiprocessing
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, NamedTuple

from msprobe_hooks.analysis.answer.run_view import StepView
from msprobe_hooks.analysis.answer.symptom import SampleCause
from msprobe_hooks.analysis.results import ModuleRow, PairResult, Status, Verdict

FLOOR = 1e-12  # exact zeros on a log axis
MOST_SAMPLES = 6  # panels of the decode heatmap: the samples with the largest gaps


def _figure(**kwargs: Any) -> Any:
    """A figure without pyplot (no GUI backend, no global state): the Agg canvas writes the PNG."""
    from matplotlib.figure import Figure

    return Figure(dpi=100, **kwargs)


_MATHTEXT = re.compile(r"^\$\\mathdefault\{(.*)\}\$$")
_EXPONENT = re.compile(r"\^\{(-?\d+)\}")
_SUPERSCRIPT = str.maketrans("-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")


def plain_power(label: str) -> str:
    """A log axis label of matplotlib's (``$\\mathdefault{2\\times10^{-3}}$``) as plain text (2×10⁻³); any
    other label as it is."""
    found = _MATHTEXT.match(label)
    if found is None:
        return label
    text = _EXPONENT.sub(lambda e: e.group(1).translate(_SUPERSCRIPT), found.group(1).replace("\\times", "\u00d7"))
    return label if any(c in text for c in "\\{}$^") else text


def _log_y(axes: Any) -> None:
    """A log y axis labelled as matplotlib labels it (10⁻⁶, 2×10⁻³), in plain text: its own labels are mathtext,
    whose parser, built on the first label, costs about as much as the rest of the figure."""
    from matplotlib.ticker import LogFormatterSciNotation

    class Plain(LogFormatterSciNotation):
        def __call__(self, x: float, pos: int | None = None) -> str:
            return plain_power(super().__call__(x, pos))

    axes.set_yscale("log")  # its default formatters, replaced here by the same in plain text
    axes.yaxis.set_major_formatter(Plain(10))
    axes.yaxis.set_minor_formatter(Plain(10, labelOnlyBase=False))


class Point(NamedTuple):
    """What the figures draw of a compared row: the painter's process is sent these, not the rows."""

    pair: int
    order: int
    layer: int | None
    module: str
    error: float


def points(rows: Iterable[ModuleRow]) -> list[Point]:
    """The compared rows as the figures draw them, in pair, then model order."""
    compared = (Point(r.pair, r.order, r.layer, r.module, r.error) for r in rows if r.status is Status.COMPARED)  # type: ignore[arg-type]
    return sorted(compared, key=lambda p: (p.pair, p.order))


def depth(compared: Sequence[Point], results: Sequence[PairResult], threshold: float, path: str) -> None:
    """Error against depth (model order), one line per pair, each pair's first divergence marked."""
    positions = {order: x for x, order in enumerate(sorted({r.order for r in compared}))}
    by_pair: dict[int, list[Point]] = {}
    for point in compared:
        by_pair.setdefault(point.pair, []).append(point)
    figure = _figure(figsize=(10, 4.5))
    axes = figure.subplots()
    for result in sorted(results, key=lambda r: r.pair):
        mine = by_pair.get(result.pair)
        if not mine:
            continue
        xs = [positions[r.order] for r in mine]
        ys = [max(float(r.error), FLOOR) for r in mine]
        (line,) = axes.plot(xs, ys, linewidth=1, label=f"pair {result.pair} ({result.key})")
        if result.verdict is Verdict.DIVERGES:
            x, y = positions[result.first_order], max(float(result.first_error), FLOOR)
            axes.plot([x], [y], marker="o", markersize=9, color=line.get_color(), markeredgecolor="red")
            axes.annotate(f"{result.first_module} {result.first_io}", (x, y), textcoords="offset points",
                          xytext=(6, 6), fontsize=8, color="red")  # fmt: skip
    axes.axhline(threshold, color="red", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
    ticks: dict[str, int] = {}
    for r in sorted(compared, key=lambda r: r.order):
        if r.layer is not None:
            ticks.setdefault(f"L{r.layer}", positions[r.order])
        elif ticks:  # after the layers (the final norm); the embedding sits at the axis' start, unlabelled
            ticks.setdefault(r.module, positions[r.order])
    axes.set_xticks(list(ticks.values()), list(ticks.keys()), fontsize=8)
    _log_y(axes)
    axes.set_xlabel("module (model order; ticks at each decoder layer's first compared tensor)")
    axes.set_ylabel(f"relative error (0 drawn at {FLOOR:g})")
    axes.set_title("training forward vs inference prefill: error by depth")
    if len(results) <= 12:
        axes.legend(fontsize=8, loc="upper left")
    axes.grid(True, which="major", alpha=0.3)
    figure.subplots_adjust(left=0.08, right=0.98, bottom=0.13, top=0.92)  # fixed: tight_layout costs 0.1-0.3 s
    figure.savefig(path)


def decode_samples(samples: Sequence[SampleCause]) -> list[SampleCause]:
    """The samples the decode heatmap shows: those with a compared decode pair, the largest gaps first."""
    return [s for s in samples if any(r.compared for r in s.decode)][:MOST_SAMPLES]


def decode_heatmap(layer_errors: Mapping[int, Mapping[int, float]], samples: Sequence[SampleCause], path: str) -> None:
    """Error by decode token (x) and decoder layer (y), one panel per sample of :func:`decode_samples`: the
    largest error among a layer's compared tensors (``layer_errors``: per pair, ``RowStore.layer_errors``), log
    scale."""
    import numpy

    shown = decode_samples(samples)
    top = max((error for errors in layer_errors.values() for error in errors.values()), default=1e-6)
    top = max(top, 1e-6)
    figure = _figure(figsize=(3.2 * len(shown) + 1, 3.6))
    axes = figure.subplots(1, len(shown), squeeze=False)
    image = None
    for ax, sample in zip(axes[0], shown, strict=True):
        pairs = [r for r in sample.decode if r.compared]
        errors = [layer_errors.get(r.pair, {}) for r in pairs]
        layers = sorted({layer for mine in errors for layer in mine})
        grid = numpy.full((len(layers) or 1, len(pairs)), numpy.nan)
        for x, mine in enumerate(errors):
            for y, layer in enumerate(layers):
                if layer in mine:
                    grid[y, x] = max(mine[layer], FLOOR)
        image = ax.imshow(numpy.log10(grid), aspect="auto", origin="lower", cmap="magma", vmin=-8, vmax=math.log10(top))
        ax.set_xticks(range(len(pairs)), [str(r.token_index) for r in pairs], fontsize=7)
        ax.set_yticks(range(len(layers)), [f"L{layer}" for layer in layers], fontsize=7)
        ax.set_xlabel("response token", fontsize=8)
        ax.set_title(f"{sample.key} (step {sample.global_step})", fontsize=8)
        for x, r in enumerate(pairs):
            if r.verdict is Verdict.DIVERGES and r.first_module.startswith("layers."):
                ax.plot([x], [layers.index(int(r.first_module.split(".")[1]))], "o", color="cyan", markersize=4)
    if image is not None:
        figure.colorbar(image, ax=axes[0].tolist(), label="log10 relative error", shrink=0.8)
    figure.suptitle("decode tokens: largest error per layer (dot: the first divergence)", fontsize=9)
    figure.savefig(path)


def run_heatmap(views: Sequence[StepView], path: str) -> None:
    """The largest error per decoder layer (y) and global step (x), log scale, each step's first divergence
    marked; the token gap per step below it."""
    import numpy

    layers = sorted({layer for v in views for layer in v.layer_errors})
    grid = numpy.full((len(layers) or 1, len(views)), numpy.nan)
    for x, view in enumerate(views):
        for y, layer in enumerate(layers):
            if layer in view.layer_errors:
                grid[y, x] = math.log10(max(view.layer_errors[layer], FLOOR))
    figure = _figure(figsize=(max(6, 0.5 * len(views) + 3), 5.5))
    top, bottom = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    image = top.imshow(
        grid,
        aspect="auto",
        origin="lower",
        cmap="magma",
        vmin=-8,
        extent=(-0.5, len(views) - 0.5, -0.5, len(layers) - 0.5),
    )
    figure.colorbar(image, ax=top, label="log10 relative error")
    for x, view in enumerate(views):
        if view.first_layer is not None and view.first_layer in layers:
            top.plot([x], [layers.index(view.first_layer)], "x", color="cyan", markersize=8)
    top.set_yticks(range(len(layers)), [f"L{layer}" for layer in layers], fontsize=7)
    top.set_title("the run: largest error per layer and global step (x: the step's first divergence)", fontsize=9)
    for name, style in (("probs_diff_mean", "-"), ("probs_diff_max", ":"), ("token_gap_mean", "--")):
        xs = [x for x, v in enumerate(views) if name in v.gap]
        if xs:
            bottom.plot(xs, [views[x].gap[name] for x in xs], style, marker="o", markersize=3, label=name)
    if bottom.lines:
        _log_y(bottom)
        bottom.legend(fontsize=7)
    bottom.set_ylabel("token gap", fontsize=8)
    bottom.set_xticks(range(len(views)), [str(v.global_step) for v in views], fontsize=7)
    bottom.set_xlabel("global step")
    figure.subplots_adjust(left=0.1, right=0.97, bottom=0.1, top=0.93, hspace=0.15)
    figure.savefig(path)


def _import_matplotlib() -> None:
    from matplotlib.backends import backend_agg  # noqa: F401  (the PNG writer)
    from matplotlib.figure import Figure  # noqa: F401


class Painter:
    """Draws the figures, in a second process when asked: forked before anything heavy is imported, it
    imports matplotlib (the largest part of ``compare``'s fixed cost) while this process compares the
    pairs, then draws while this one writes the tables. :meth:`finish` waits and raises what a drawing raised."""

    def __init__(self, separate_process: bool) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._drawing: list[Future[None]] = []
        if separate_process:
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
            self._drawing.append(self._pool.submit(_import_matplotlib))

    def draw(self, figure: Callable[..., None], *args: Any) -> None:
        if self._pool is None:
            figure(*args)
        else:
            self._drawing.append(self._pool.submit(figure, *args))

    def finish(self) -> None:
        try:
            for drawing in self._drawing:
                drawing.result()
        finally:
            self._drawing.clear()
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
