"""The page's interactive figures (plotly, its bundle inlined once: the page stays one file that opens offline).

Hovering a point of the depth plot or a cell of a heatmap shows the module, the pair or step and the
error. The bundle adds ~4.8 MB to ``index.html`` (plotly.js 3, minified); the PNGs of :mod:`.plots` stay
for ``summary.md``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from msprobe_hooks.analysis.answer.run_view import StepView
from msprobe_hooks.analysis.answer.symptom import SampleCause
from msprobe_hooks.analysis.report.plots import FLOOR
from msprobe_hooks.analysis.results import ModuleRow, PairResult, Status, Verdict


def _html(figure: Any, div_id: str, first: bool) -> str:
    """A figure (a plotly Figure, or the dict of one) as an HTML fragment; plotly.js inlined when ``first``."""
    import plotly.io

    if isinstance(figure, dict):  # plotly's default look, which a Figure would have brought
        figure["layout"].setdefault("template", _default_template())
    return plotly.io.to_html(
        figure, full_html=False, include_plotlyjs=first, div_id=div_id, config={"displaylogo": False}, validate=False
    )


def _default_template() -> dict[str, Any]:
    """plotly's default template, read from its file: ``plotly.io.templates[...]`` builds it as graph objects,
    importing every layout validator (0.3-0.6 s)."""
    import plotly
    import plotly.io

    name = plotly.io.templates.default
    path = os.path.join(os.path.dirname(plotly.__file__), "package_data", "templates", f"{name}.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    return plotly.io.templates[name].to_plotly_json()  # a combined default ("a+b"): plotly merges them


def _compared(rows: Sequence[ModuleRow]) -> dict[int | None, list[ModuleRow]]:
    """The compared rows of each pair, in model order."""
    by_pair: dict[int | None, list[ModuleRow]] = {}
    for row in sorted((r for r in rows if r.status is Status.COMPARED), key=lambda r: (r.pair, r.order)):
        by_pair.setdefault(row.pair, []).append(row)
    return by_pair


def depth(rows: Sequence[ModuleRow], results: Sequence[PairResult], threshold: float) -> dict[str, Any]:
    """Error against the position in model order, one line per pair; hover: module, input/output, pair, error.

    The figure as plotly's JSON, not a Figure: it has a line per pair, and a Figure validates every point (seconds
    for a thousand pairs)."""
    compared = _compared(rows)
    positions = {order: x for x, order in enumerate(sorted({r.order for mine in compared.values() for r in mine}))}
    traces: list[dict[str, Any]] = []
    for result in sorted(results, key=lambda r: r.pair):
        mine = compared.get(result.pair, [])
        if not mine:
            continue
        label = f"pair {result.pair} ({result.key}" + (
            f", token {result.token_index})" if result.token_index is not None else ")"
        )
        traces.append(
            {
                "customdata": [[r.module, r.io] for r in mine],
                "hovertemplate": f"{label}<br>%{{customdata[0]}} %{{customdata[1]}}<br>error %{{y:.3g}}<extra></extra>",
                "marker": {"size": 4},
                "mode": "lines+markers",
                "name": label,
                "x": [positions[r.order] for r in mine],
                "y": [max(float(r.error), FLOOR) for r in mine],  # type: ignore[arg-type]
                "type": "scatter",
            }
        )
        if result.verdict is Verdict.DIVERGES and result.first_order in positions:
            traces.append(
                {
                    "hovertemplate": f"first divergence of {label}<br>{result.first_module} {result.first_io}"
                    "<br>error %{y:.3g}<extra></extra>",
                    "marker": {"color": "rgba(0,0,0,0)", "line": {"color": "red", "width": 2}, "size": 12},
                    "mode": "markers",
                    "showlegend": False,
                    "x": [positions[result.first_order]],
                    "y": [max(float(result.first_error), FLOOR)],  # type: ignore[arg-type]
                    "type": "scatter",
                }
            )
    threshold_line = {"color": "red", "dash": "dash", "width": 1}
    layout = {
        "shapes": [
            {
                "line": threshold_line,
                "type": "line",
                "x0": 0,
                "x1": 1,
                "xref": "x domain",
                "y0": threshold,
                "y1": threshold,
                "yref": "y",
            }
        ],  # fmt: skip
        "title": {"text": "training forward vs inference: error by depth"},
        "xaxis": {"title": {"text": "module (model order)"}},
        "yaxis": {"type": "log", "title": {"text": "relative error"}},
        "height": 420,
        "margin": {"t": 50, "l": 60, "r": 20, "b": 50},
        "showlegend": len(results) <= 12,
    }
    return {"data": traces, "layout": layout}


def decode(
    layer_errors: Mapping[int, Mapping[int, float]], samples: Sequence[SampleCause], most: int = 6
) -> Any | None:
    """Error by decode token and decoder layer, a heatmap per sample; hover: token, layer, error. ``layer_errors``:
    per pair the largest error of each decoder layer (``RowStore.layer_errors``)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    shown = [s for s in samples if any(r.compared for r in s.decode)][:most]
    if not shown:
        return None
    figure = make_subplots(rows=1, cols=len(shown), subplot_titles=[f"{s.key} (step {s.global_step})" for s in shown])
    for col, sample in enumerate(shown, 1):
        pairs = [r.pair for r in sample.decode if r.compared]
        errors = [layer_errors.get(p, {}) for p in pairs]
        layers = sorted({layer for mine in errors for layer in mine})
        z = [[math.log10(max(mine[layer], FLOOR)) if layer in mine else None for mine in errors] for layer in layers]
        figure.add_trace(
            go.Heatmap(
                z=z,
                x=[r.token_index for r in sample.decode if r.compared],
                y=[f"L{layer}" for layer in layers],
                coloraxis="coloraxis",
                hovertemplate=f"{sample.key}<br>response token %{{x}}<br>layer %{{y}}"
                "<br>log10 error %{z:.2f}<extra></extra>",
            ),
            row=1,
            col=col,
        )
    figure.update_layout(
        title="decode tokens: largest error per layer",
        coloraxis={"colorscale": "Magma", "cmin": -8, "colorbar": {"title": "log10 error"}},
        height=380,
        margin={"t": 70, "l": 50, "r": 20, "b": 40},
    )
    return figure


def run(views: Sequence[StepView]) -> Any:
    """Layer x global step heatmap of the largest error, the token gap per step beside it; hover: step, layer, error."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    layers = sorted({layer for v in views for layer in v.layer_errors})
    steps = [v.global_step for v in views]
    z = [
        [math.log10(max(v.layer_errors[layer], FLOOR)) if layer in v.layer_errors else None for v in views]
        for layer in layers
    ]
    figure = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.65, 0.35], vertical_spacing=0.08)
    figure.add_trace(
        go.Heatmap(
            z=z,
            x=steps,
            y=[f"L{layer}" for layer in layers],
            colorscale="Magma",
            zmin=-8,
            colorbar={"title": "log10 error", "len": 0.6, "y": 0.7},
            hovertemplate="global step %{x}<br>layer %{y}<br>log10 error %{z:.2f}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    firsts = [v for v in views if v.first is not None and v.first_layer is not None]
    figure.add_trace(
        go.Scatter(
            x=[v.global_step for v in firsts],
            y=[f"L{v.first_layer}" for v in firsts],
            mode="markers",
            marker={"color": "cyan", "size": 9, "symbol": "x"},
            name="first divergence",
            customdata=[f"{v.first.first_module} {v.first.first_io}" for v in firsts],  # type: ignore[union-attr]
            hovertemplate="global step %{x}: first divergence<br>%{customdata}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    for name, dash in (("probs_diff_mean", "solid"), ("probs_diff_max", "dot"), ("token_gap_mean", "dash")):
        with_gap = [v for v in views if name in v.gap]
        if with_gap:
            figure.add_trace(
                go.Scatter(
                    x=[v.global_step for v in with_gap],
                    y=[v.gap[name] for v in with_gap],
                    mode="lines+markers",
                    line={"dash": dash},
                    name=name,
                    hovertemplate=f"global step %{{x}}<br>{name} %{{y:.3g}}<extra></extra>",
                ),
                row=2,
                col=1,
            )
    figure.update_yaxes(type="log", title_text="token gap", row=2, col=1)
    figure.update_xaxes(title_text="global step", row=2, col=1)
    figure.update_layout(title="the run: error per layer and global step, the token gap", height=520)
    return figure


def fragments(figures: Sequence[tuple[str, Any]]) -> dict[str, str]:
    """Each (div id, figure) as an HTML fragment; plotly.js inlined in the first only."""
    return {div_id: _html(figure, div_id, first=i == 0) for i, (div_id, figure) in enumerate(figures)}
