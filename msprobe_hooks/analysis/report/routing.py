"""The MoE routing verdict in words, and the report's routing section (``routing.csv``).

What the routers chose is compared in :mod:`msprobe_hooks.analysis.comparing.routing`; whether a flip is within
the noise, and whether routing names the divergence, the routing rule of :mod:`msprobe_hooks.analysis.answer.verdict`
decides. This module only says it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from msprobe_hooks.analysis.results import ROUTING_COLUMNS, FirstRule, PairResult, Status

ROUTING_CSV = "routing.csv"


def noise_note(result: PairResult) -> str:
    """For a numeric first divergence in a layer whose router flipped tokens within the noise only: why."""
    layer = next((r for r in result.routing if r.layer == result.routing_noise_layer), None)
    if layer is None:
        return ""
    return (
        f"; it follows {layer.flipped} of {layer.tokens} tokens sent to other experts at layer {layer.layer} "
        "where the router's top-k margin is within the logits' noise (rounding, not a fault of the router)"
    )


def describe(result: PairResult) -> str:
    """The routing verdict of a pair in words: "routing diverges at layer k (...)"."""
    layer = next((r for r in result.routing if r.layer == result.routing_layer), None)
    if layer is None:
        return f"routing diverges at layer {result.routing_layer}"
    text = (
        f"routing diverges at layer {layer.layer} ({layer.flipped} of {layer.tokens} tokens, {layer.share:.1%}, "
        f"go to other experts than in training"
    )
    if layer.within_noise:
        text += f"; {layer.within_noise} of them within the logits' noise"
    if result.numeric_first:
        text += f"; the numbers diverge from {result.numeric_first} on"
    return text + ")"


def by_layer(results: Sequence[PairResult]) -> Any:
    """Per layer over every pair: tokens, flipped, their share, within noise (a DataFrame; None without routing).

    pandas is imported only for MoE pairs: a dense model's report does without it (``analysis/table.py``)."""
    rows = [r.record() for result in results for r in result.routing if r.status is Status.COMPARED]
    if not rows:
        return None
    import pandas

    frame = pandas.DataFrame(rows).groupby("layer", as_index=False)[["tokens", "flipped", "within_noise"]].sum()
    frame.insert(3, "share", frame["flipped"] / frame["tokens"])
    frame["beyond_noise"] = frame["flipped"] - frame["within_noise"]
    return frame


def headline(results: Sequence[PairResult]) -> str:
    """One sentence over every pair: where routing first diverges, or that it agrees (noise flips counted)."""
    frame = by_layer(results)
    if frame is None:
        reasons = {r.reason for result in results for r in result.routing if r.reason}
        return "routing not compared: " + "; ".join(sorted(reasons)) if reasons else ""
    flipped = frame[frame["flipped"] > 0]
    beyond = frame[frame["beyond_noise"] > 0]
    if beyond.empty:
        if flipped.empty:
            return f"routing agrees: every token goes to the same experts in all {len(frame)} MoE layers"
        noise = int(flipped["flipped"].sum())
        return (
            f"routing agrees beyond the noise: {noise} flips, all where the router's top-k margin is within the "
            f"logits' noise (first at layer {int(flipped['layer'].iloc[0])}): rounding, not blamed"
        )
    first = beyond.iloc[0]
    cause = any(r.first_rule == FirstRule.ROUTING for r in results)
    said = "routing diverges at layer" if cause else "tokens go to other experts from layer"
    return (
        f"{said} {int(first['layer'])}: {int(first['flipped'])} of {int(first['tokens'])} tokens "
        f"({first['share']:.1%}) go to other experts than in training"
        + ("" if cause else ", after the first numeric divergence: its consequence, not its cause")
        + (
            f"; first flip (noise included) at layer {int(flipped['layer'].iloc[0])}"
            if int(flipped["layer"].iloc[0]) != int(first["layer"])
            else ""
        )
    )


def section(folder: str, results: Sequence[PairResult]) -> tuple[str, str] | None:
    """``routing.csv`` written; the report's routing section as (Markdown, HTML); None for dense models."""
    import html

    records = [r.record() for result in results for r in result.routing]
    if not records:
        return None
    import pandas

    pandas.DataFrame(records, columns=list(ROUTING_COLUMNS)).to_csv(os.path.join(folder, ROUTING_CSV), index=False)
    verdict = headline(results)
    frame = by_layer(results)
    explained = (
        "Per MoE layer over every pair: the tokens whose set of experts differs between training and inference "
        "(`flipped`), and of those the ones where the training router's top-k margin is within the logits' noise "
        "(`within_noise`: rounding can swap such experts; reported, never blamed). Per pair and layer, with the "
        f"sources of the ids: `{ROUTING_CSV}`."
    )
    markdown = f"\n## Routing\n\n**{verdict}**\n\n{explained}\n\n"
    page = f"<h2>Routing</h2><p><strong>{html.escape(verdict)}</strong></p><p>{html.escape(explained)}</p>"
    if frame is not None:
        shown = frame.assign(share=frame["share"].map(lambda v: f"{v:.1%}"))
        header = "| " + " | ".join(shown.columns) + " |\n|" + "---|" * len(shown.columns) + "\n"
        markdown += header + "".join("| " + " | ".join(map(str, row)) + " |\n" for row in shown.itertuples(index=False))
        page += shown.to_html(index=False)
    return markdown, page
