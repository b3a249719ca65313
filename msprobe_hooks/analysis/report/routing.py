"""The MoE routing verdict in words, and the report's routing section (``routing.csv``).

What the routers chose is compared in :mod:`msprobe_hooks.analysis.comparing.routing`; whether a flip is within
the noise, and whether routing names the divergence, the routing rule of :mod:`msprobe_hooks.analysis.answer.verdict`
decides. This module only says it.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from msprobe_hooks.analysis.answer.assemble import Answer
from msprobe_hooks.analysis.report.sections import Section
from msprobe_hooks.analysis.results import ROUTING_COLUMNS, FirstRule, PairResult, Status
from msprobe_hooks.analysis.table import Table

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


@dataclass(frozen=True)
class LayerFlips:
    """One MoE layer over every pair: its tokens, those sent to other experts, and of those the ones within the
    logits' noise."""

    layer: int
    tokens: int
    flipped: int
    within_noise: int

    @property
    def share(self) -> float:
        return self.flipped / self.tokens if self.tokens else math.nan

    @property
    def beyond_noise(self) -> int:
        return self.flipped - self.within_noise


def by_layer(results: Sequence[PairResult]) -> list[LayerFlips]:
    """Per layer over every pair (its compared layers), in layer order; empty without routing compared."""
    sums: dict[int, list[int]] = {}
    for result in results:
        for r in result.routing:
            if r.status is Status.COMPARED and r.layer is not None:
                mine = sums.setdefault(r.layer, [0, 0, 0])
                for i, count in enumerate((r.tokens, r.flipped, r.within_noise)):
                    mine[i] += count or 0
    return [LayerFlips(layer, *sums[layer]) for layer in sorted(sums)]


def headline(results: Sequence[PairResult]) -> str:
    """One sentence over every pair: where routing first diverges, or that it agrees (noise flips counted)."""
    layers = by_layer(results)
    if not layers:
        reasons = {r.reason for result in results for r in result.routing if r.reason}
        return "routing not compared: " + "; ".join(sorted(reasons)) if reasons else ""
    flipped = [f for f in layers if f.flipped > 0]
    beyond = [f for f in layers if f.beyond_noise > 0]
    if not beyond:
        if not flipped:
            return f"routing agrees: every token goes to the same experts in all {len(layers)} MoE layers"
        noise = sum(f.flipped for f in flipped)
        return (
            f"routing agrees beyond the noise: {noise} flips, all where the router's top-k margin is within the "
            f"logits' noise (first at layer {flipped[0].layer}): rounding, not blamed"
        )
    first = beyond[0]
    cause = any(r.first_rule == FirstRule.ROUTING for r in results)
    said = "routing diverges at layer" if cause else "tokens go to other experts from layer"
    return (
        f"{said} {first.layer}: {first.flipped} of {first.tokens} tokens "
        f"({first.share:.1%}) go to other experts than in training"
        + ("" if cause else ", after the first numeric divergence: its consequence, not its cause")
        + (f"; first flip (noise included) at layer {flipped[0].layer}" if flipped[0].layer != first.layer else "")
    )


def section(folder: str, found: Answer) -> Section | None:
    """The routing section (MoE pairs): ``routing.csv``, per pair and layer; per layer over every pair here."""
    records = [r.record() for result in found.results for r in result.routing]
    if not records:
        return None
    Table(records, ROUTING_COLUMNS).to_csv(os.path.join(folder, ROUTING_CSV))
    explained = (
        "Per MoE layer over every pair: the tokens whose set of experts differs between training and inference "
        "(`flipped`), and of those the ones where the training router's top-k margin is within the logits' noise "
        "(`within_noise`: rounding can swap such experts; reported, never blamed). Per pair and layer, with the "
        f"sources of the ids: `{ROUTING_CSV}`."
    )
    markdown = f"## Routing\n\n{explained}"
    page = f"<h2>Routing</h2><p>{html.escape(explained)}</p>"
    layers = by_layer(found.results)
    if layers:
        shown = Table(
            {
                "layer": f.layer,
                "tokens": f.tokens,
                "flipped": f.flipped,
                "share": f"{f.share:.1%}",
                "within_noise": f.within_noise,
                "beyond_noise": f.beyond_noise,
            }
            for f in layers
        )
        markdown += f"\n\n{shown.markdown()}"
        page += shown.html()
    return Section("routing", headline(found.results), (ROUTING_CSV,), markdown, page)
