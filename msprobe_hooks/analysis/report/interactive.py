"""The page's interactive figures (plotly, its bundle inlined once: the page stays one file that opens offline).

Each draws a figure's data (:mod:`.figures`; the PNGs of :mod:`.plots`, for ``summary.md``, render the same).
Hovering a point of the depth plot or a cell of a heatmap shows the module, the pair or step and the
error. The bundle adds ~4.8 MB to ``index.html`` (plotly.js 3, minified).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from msprobe_hooks.analysis.report import figures


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


def _marks(heatmap: figures.Heatmap, name: str, symbol: str, size: int) -> Any:
    """A heatmap's marks (first divergences) as a scatter over its cells; hover: what each is."""
    import plotly.graph_objects as go

    return go.Scatter(
        x=[heatmap.x[int(m.x)] for m in heatmap.marks],
        y=[heatmap.y[int(m.y)] for m in heatmap.marks],
        mode="markers",
        marker={"color": "cyan", "size": size, "symbol": symbol},
        name=name,
        showlegend=False,
        customdata=[m.text for m in heatmap.marks],
        hovertemplate=f"%{{x}}: {name}<br>%{{customdata}}<extra></extra>",
    )


def depth(figure: figures.Depth) -> dict[str, Any]:
    """The depth figure; hover: module, input/output, pair, error.

    As plotly's JSON, not a Figure: it has a line per pair, and a Figure validates every point (seconds for a
    thousand pairs)."""
    traces: list[dict[str, Any]] = []
    for line in figure.lines:
        traces.append(
            {
                "customdata": line.where,
                "hovertemplate": f"{line.label}<br>%{{customdata[0]}} %{{customdata[1]}}<br>error %{{y:.3g}}"
                "<extra></extra>",
                "marker": {"size": 4},
                "mode": "lines+markers",
                "name": line.label,
                "x": line.x,
                "y": line.y,
                "type": "scatter",
            }
        )
        if line.first is not None:
            traces.append(
                {
                    "hovertemplate": f"first divergence of {line.label}<br>{line.first.text}"
                    "<br>error %{y:.3g}<extra></extra>",
                    "marker": {"color": "rgba(0,0,0,0)", "line": {"color": "red", "width": 2}, "size": 12},
                    "mode": "markers",
                    "showlegend": False,
                    "x": [line.first.x],
                    "y": [line.first.y],
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
                "y0": figure.threshold,
                "y1": figure.threshold,
                "yref": "y",
            }
        ],  # fmt: skip
        "title": {"text": figure.title},
        "xaxis": {
            "title": {"text": figure.x_title},
            "tickmode": "array",
            "tickvals": [x for x, _ in figure.ticks],
            "ticktext": [name for _, name in figure.ticks],
        },
        "yaxis": {"type": "log", "title": {"text": figure.y_title}},
        "height": 420,
        "margin": {"t": 50, "l": 60, "r": 20, "b": 80},
        "showlegend": figure.legend,
    }
    return {"data": traces, "layout": layout}


def decode(figure: figures.Decode) -> Any:
    """The decode heatmap, a panel per sample; hover: token, layer, error, and what each first divergence is."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = figure.panels
    plot = make_subplots(rows=1, cols=len(panels), subplot_titles=[p.title for p in panels])
    for col, panel in enumerate(panels, 1):
        plot.add_trace(
            go.Heatmap(
                z=panel.z,
                x=panel.x,
                y=panel.y,
                coloraxis="coloraxis",
                hovertemplate=f"{panel.title}<br>{figure.x_title} %{{x}}<br>layer %{{y}}"
                "<br>log10 error %{z:.2f}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        if panel.marks:
            plot.add_trace(_marks(panel, "first divergence", "circle", 6), row=1, col=col)
        plot.update_xaxes(title_text=figure.x_title, type="category", row=1, col=col)
    plot.update_layout(
        title=figure.title,
        coloraxis={
            "colorscale": "Magma",
            "cmin": figures.LOG10_LOWEST,
            "cmax": figure.highest,
            "colorbar": {"title": figure.colour_title},
        },
        height=380,
        margin={"t": 70, "l": 50, "r": 20, "b": 40},
    )
    return plot


def run(figure: figures.Run) -> Any:
    """The run figure: the heatmap above, the token gap per step below; hover: step, layer, error."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    heatmap = figure.heatmap
    plot = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.65, 0.35], vertical_spacing=0.08)
    plot.add_trace(
        go.Heatmap(
            z=heatmap.z,
            x=heatmap.x,
            y=heatmap.y,
            colorscale="Magma",
            zmin=figures.LOG10_LOWEST,
            colorbar={"title": figure.colour_title, "len": 0.6, "y": 0.7},
            hovertemplate=f"{figure.x_title} %{{x}}<br>layer %{{y}}<br>log10 error %{{z:.2f}}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    plot.add_trace(_marks(heatmap, "first divergence", "x", 9), row=1, col=1)
    for gap in figure.gaps:
        plot.add_trace(
            go.Scatter(
                x=[heatmap.x[x] for x in gap.x],
                y=gap.y,
                mode="lines+markers",
                line={"dash": gap.dash},
                name=gap.name,
                hovertemplate=f"{figure.x_title} %{{x}}<br>{gap.name} %{{y:.3g}}<extra></extra>",
            ),
            row=2,
            col=1,
        )
    plot.update_yaxes(type="log", title_text=figure.gap_title, row=2, col=1)
    plot.update_xaxes(type="category", row=1, col=1)
    plot.update_xaxes(title_text=figure.x_title, type="category", row=2, col=1)
    plot.update_layout(title=figure.title, height=520)
    return plot


def fragments(drawn: Sequence[tuple[str, Any]]) -> dict[str, str]:
    """Each (div id, figure) as an HTML fragment, in the page's order: plotly.js inlined in the first only (the
    others' scripts call it)."""
    return {div_id: _html(figure, div_id, first=i == 0) for i, (div_id, figure) in enumerate(drawn)}
