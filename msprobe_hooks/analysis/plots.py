"""The report's figures (matplotlib, PNG): error against depth per pair, error by decode token and layer.

PNG keeps ``summary.md`` readable anywhere; ``index.html`` embeds them (base64), so the page opens offline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from msprobe_hooks.analysis.results import PairResult, Status, Verdict
from msprobe_hooks.analysis.run_view import StepView
from msprobe_hooks.analysis.symptom import SampleCause

FLOOR = 1e-12  # exact zeros on a log axis


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def plot(rows: Any, results: Sequence[PairResult], threshold: float, path: str) -> None:
    """Error against depth (model order), one line per pair, each pair's first divergence marked."""
    pyplot = _pyplot()
    compared = rows[rows["status"] == Status.COMPARED.value]
    positions = {order: x for x, order in enumerate(sorted(compared["order"].unique()))}
    figure, axes = pyplot.subplots(figsize=(10, 4.5), dpi=100)
    floor = FLOOR
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


def decode_heatmap(rows: Any, samples: Sequence[SampleCause], path: str, most: int = 6) -> bool:
    """Error by decode token (x) and decoder layer (y), one panel per sample (the ``most`` largest gaps):
    the largest error among a layer's compared tensors, log scale. False when no decode pair compared."""
    import numpy

    shown = [s for s in samples if any(r.compared for r in s.decode)][:most]
    if not shown:
        return False
    pyplot = _pyplot()
    compared = rows[(rows["status"] == Status.COMPARED.value) & rows["layer"].notna()]
    figure, axes = pyplot.subplots(1, len(shown), figsize=(3.2 * len(shown) + 1, 3.6), dpi=100, squeeze=False)
    image = None
    top = max(float(compared["error"].max()), 1e-6) if not compared.empty else 1.0
    for ax, sample in zip(axes[0], shown, strict=True):
        pairs = [r for r in sample.decode if r.compared]
        layers = sorted({int(x) for x in compared[compared["pair"].isin([r.pair for r in pairs])]["layer"]})
        grid = numpy.full((len(layers) or 1, len(pairs)), numpy.nan)
        for x, r in enumerate(pairs):
            mine = compared[compared["pair"] == r.pair].groupby("layer")["error"].max()
            for y, layer in enumerate(layers):
                if layer in mine.index:
                    grid[y, x] = max(float(mine[layer]), FLOOR)
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
    pyplot.close(figure)
    return True


def run_heatmap(views: Sequence[StepView], path: str) -> None:
    """The largest error per decoder layer (y) and global step (x), log scale, each step's first divergence
    marked; the token gap per step below it."""
    import numpy

    pyplot = _pyplot()
    layers = sorted({layer for v in views for layer in v.layer_errors})
    grid = numpy.full((len(layers) or 1, len(views)), numpy.nan)
    for x, view in enumerate(views):
        for y, layer in enumerate(layers):
            if layer in view.layer_errors:
                grid[y, x] = math.log10(max(view.layer_errors[layer], FLOOR))
    figure, (top, bottom) = pyplot.subplots(2, 1, figsize=(max(6, 0.5 * len(views) + 3), 5.5), dpi=100, sharex=True,
                                            gridspec_kw={"height_ratios": [2, 1]})  # fmt: skip
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
        bottom.set_yscale("log")
        bottom.legend(fontsize=7)
    bottom.set_ylabel("token gap", fontsize=8)
    bottom.set_xticks(range(len(views)), [str(v.global_step) for v in views], fontsize=7)
    bottom.set_xlabel("global step")
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
