"""The report's figures as PNGs (matplotlib) for ``summary.md``: each a thin renderer of a figure's data
(:mod:`.figures`, which the page draws too: :mod:`.interactive`); drawn by a :class:`Painter`.

PNG keeps ``summary.md`` readable anywhere. The painter's process is sent the figures' data (plain values),
so it needs matplotlib alone.
"""

from __future__ import annotations

import multiprocessing
import re
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from msprobe_hooks.analysis.report import figures


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


def _dash(name: str) -> str:
    """A line style of :mod:`.figures` (plotly's name) as matplotlib's."""
    return {"solid": "-", "dot": ":", "dash": "--"}[name]


def depth(figure: figures.Depth, path: str) -> None:
    """The depth figure as a PNG: a line per pair, each first divergence circled in red and labelled."""
    canvas = _figure(figsize=(10, 4.5))
    axes = canvas.subplots()
    for line in figure.lines:
        (drawn,) = axes.plot(line.x, line.y, linewidth=1, label=line.label)
        if line.first is not None:
            at = (line.first.x, line.first.y)
            axes.plot(*at, marker="o", markersize=9, color=drawn.get_color(), markeredgecolor="red")
            axes.annotate(line.first.text, at, textcoords="offset points", xytext=(6, 6), fontsize=8, color="red")
    axes.axhline(figure.threshold, color="red", linestyle="--", linewidth=1, label=f"threshold {figure.threshold:g}")
    axes.set_xticks([x for x, _ in figure.ticks], [name for _, name in figure.ticks], fontsize=7, rotation=45,
                    ha="right", rotation_mode="anchor")  # fmt: skip
    _log_y(axes)
    axes.set_xlabel(figure.x_title)
    axes.set_ylabel(figure.y_title)
    axes.set_title(figure.title)
    if figure.legend:
        axes.legend(fontsize=8, loc="upper left")
    axes.grid(True, which="major", alpha=0.3)
    canvas.subplots_adjust(left=0.08, right=0.98, bottom=0.2, top=0.92)  # fixed: tight_layout costs 0.1-0.3 s
    canvas.savefig(path)


def _heatmap(axes: Any, heatmap: figures.Heatmap, highest: float | None, marker: str) -> Any:
    """One heatmap on ``axes``, its marks drawn; returns the image (for the colour bar)."""
    import numpy

    grid = numpy.array(heatmap.z or [[None] * len(heatmap.x)], dtype=float)  # None: NaN, drawn blank
    image = axes.imshow(grid, aspect="auto", origin="lower", cmap="magma", vmin=figures.LOG10_LOWEST, vmax=highest,
                        extent=(-0.5, len(heatmap.x) - 0.5, -0.5, max(len(heatmap.y), 1) - 0.5))  # fmt: skip
    for mark in heatmap.marks:
        axes.plot([mark.x], [mark.y], marker, color="cyan", markersize=8 if marker == "x" else 4)
    axes.set_yticks(range(len(heatmap.y)), heatmap.y, fontsize=7)
    return image


def decode(figure: figures.Decode, path: str) -> None:
    """The decode heatmap as a PNG: a panel per sample."""
    canvas = _figure(figsize=(3.2 * len(figure.panels) + 1, 3.6))
    axes = canvas.subplots(1, len(figure.panels), squeeze=False)
    image = None
    for ax, panel in zip(axes[0], figure.panels, strict=True):
        image = _heatmap(ax, panel, figure.highest, "o")
        ax.set_xticks(range(len(panel.x)), panel.x, fontsize=7)
        ax.set_xlabel(figure.x_title, fontsize=8)
        ax.set_title(panel.title, fontsize=8)
    if image is not None:
        canvas.colorbar(image, ax=axes[0].tolist(), label=figure.colour_title, shrink=0.8)
    canvas.suptitle(figure.title, fontsize=9)
    canvas.savefig(path)


def run(figure: figures.Run, path: str) -> None:
    """The run figure as a PNG: the heatmap above, the token gap below."""
    heatmap = figure.heatmap
    canvas = _figure(figsize=(max(6, 0.5 * len(heatmap.x) + 3), 5.5))
    top, bottom = canvas.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    canvas.colorbar(_heatmap(top, heatmap, None, "x"), ax=top, label=figure.colour_title)
    top.set_title(figure.title, fontsize=9)
    for gap in figure.gaps:
        bottom.plot(gap.x, gap.y, _dash(gap.dash), marker="o", markersize=3, label=gap.name)
    if figure.gaps:
        _log_y(bottom)
        bottom.legend(fontsize=7)
    bottom.set_ylabel(figure.gap_title, fontsize=8)
    bottom.set_xticks(range(len(heatmap.x)), heatmap.x, fontsize=7)
    bottom.set_xlabel(figure.x_title)
    canvas.subplots_adjust(left=0.1, right=0.97, bottom=0.1, top=0.93, hspace=0.15)
    canvas.savefig(path)


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
