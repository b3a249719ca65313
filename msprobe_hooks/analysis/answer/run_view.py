"""The run, not the pair, as the unit of the answer: per global step a verdict, the error per layer, the gap.

In RL the weights change every step and are handed from the training engine to the inference engine;
a fault there (a tensor left out of the sync, a stale cache) shows from one global step on. The pairs
of a run are grouped by the training side's global step (``align`` never pairs across steps): per step
the verdict, the first divergence, the largest error per decoder layer, and the token gap of that step's
samples (``logprob_gap.jsonl``: verl's ``training/rollout_probs_diff_*`` and the log-prob gap), then the
first global step at which any module steps over its pair's noise, and that module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from msprobe_hooks.analysis.results import PairResult, StepRow, Verdict

# The scalars of a step, as steps.csv and TensorBoard name them (tag: msprobe_hooks/<scalar>[/L<layer>]).
SCALARS = (
    "first_divergent_layer",  # the first divergence's decoder layer (-1: none, or outside the layers)
    "largest_error",
    "layer_error",  # per layer
    "diverging_pairs",
    "token_gap_mean",
    "token_gap_max",
    "probs_diff_mean",
    "probs_diff_max",
)


@dataclass
class StepView:
    """One global step of the run."""

    global_step: Any
    pairs: int = 0
    diverging: int = 0
    verdict: Verdict = Verdict.NOTHING_COMPARED
    first: PairResult | None = None  # the pair whose first divergence comes earliest in the model
    largest: PairResult | None = None
    layer_errors: dict[int, float] = field(default_factory=dict)
    gap: dict[str, float] = field(default_factory=dict)  # token_gap_*, probs_diff_* of its samples

    @property
    def first_layer(self) -> int | None:
        return self.first.first_layer if self.first is not None else None

    def scalars(self) -> list[tuple[str, int | None, float]]:
        """(scalar, layer, value) of this step, tidy: one per scalar (and layer)."""
        out: list[tuple[str, int | None, float]] = [
            ("first_divergent_layer", None, float(-1 if self.first_layer is None else self.first_layer)),
            ("diverging_pairs", None, float(self.diverging)),
        ]
        if self.largest is not None and self.largest.max_error is not None:
            out.append(("largest_error", None, float(self.largest.max_error)))
        out += [("layer_error", layer, error) for layer, error in sorted(self.layer_errors.items())]
        out += [(name, None, value) for name, value in self.gap.items()]
        return out


def token_gap(lines: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """A step's token gap over its samples: means weighted by tokens (verl's batch means), maxima of maxima."""
    numbers = [g for g in lines if isinstance(g.get("tokens"), int) and g["tokens"] > 0]
    tokens = sum(g["tokens"] for g in numbers)
    if not tokens:
        return {}
    out = {}
    for name, field_mean, field_max in (
        ("token_gap", "mean", "max"),
        ("probs_diff", "probs_diff_mean", "probs_diff_max"),
    ):
        if all(
            isinstance(g.get(field_mean), (int, float)) and isinstance(g.get(field_max), (int, float)) for g in numbers
        ):
            out[f"{name}_mean"] = sum(g[field_mean] * g["tokens"] for g in numbers) / tokens
            out[f"{name}_max"] = max(g[field_max] for g in numbers)
    return out


def steps(
    results: Sequence[PairResult],
    layer_errors: Mapping[int, Mapping[int, float]],
    gaps: Mapping[tuple[str, Any], Mapping[str, Any]] = {},  # noqa: B006  (read only)
) -> list[StepView]:
    """One :class:`StepView` per global step that has pairs or gap lines, in step order; ``layer_errors``: per pair
    the largest error of each decoder layer (``RowStore.layer_errors``)."""
    views: dict[Any, StepView] = {}
    for r in results:
        view = views.setdefault(r.global_step, StepView(r.global_step))
        view.pairs += 1
        if r.verdict is Verdict.DIVERGES:
            view.diverging += 1
            if view.first is None or (r.first_order, r.pair) < (view.first.first_order, view.first.pair):
                view.first = r
        if r.max_error is not None and (view.largest is None or r.max_error > view.largest.max_error):
            view.largest = r
        for layer, error in layer_errors.get(r.pair, {}).items():
            view.layer_errors[layer] = max(view.layer_errors.get(layer, 0.0), error)
    for view in views.values():
        measured = view.largest is not None
        view.verdict = Verdict.DIVERGES if view.diverging else Verdict.NO_DIVERGENCE if measured else view.verdict
    by_step: dict[Any, list[Mapping[str, Any]]] = {}
    for (_, global_step), line in gaps.items():
        by_step.setdefault(global_step, []).append(line)
    for global_step, lines in by_step.items():
        views.setdefault(global_step, StepView(global_step)).gap = token_gap(lines)
    return sorted(views.values(), key=lambda v: (v.global_step is None, str(type(v.global_step)), v.global_step))


def first_diverging(views: Sequence[StepView]) -> StepView | None:
    """The first global step with a divergence (the steps before it were compared and clean)."""
    return next((v for v in views if v.verdict is Verdict.DIVERGES), None)


def is_run(views: Sequence[StepView]) -> bool:
    """Whether the pairs span several global steps: only then is the run view written."""
    return len([v for v in views if v.global_step is not None]) > 1


def run_verdict(views: Sequence[StepView]) -> str:
    """One sentence: the first global step that diverges and its module, or that none does."""
    first = first_diverging(views)
    compared = [v for v in views if v.verdict in (Verdict.DIVERGES, Verdict.NO_DIVERGENCE)]
    if first is None:
        return f"run: no global step diverges ({len(compared)} steps compared)"
    clean = [v for v in compared if v.verdict is Verdict.NO_DIVERGENCE and _before(v, first)]
    r = first.first
    return (
        f"run: global step {first.global_step} is the first to diverge, at {r.first_module} {r.first_io} "
        f"({first.diverging} of {first.pairs} pairs; {len(clean)} steps before it clean)"
    )


def _before(view: StepView, other: StepView) -> bool:
    try:
        return view.global_step < other.global_step
    except TypeError:
        return False


def tidy(views: Sequence[StepView]) -> list[StepRow]:
    """``steps.csv``: one row per global step, scalar and layer (a long table)."""
    return [StepRow(v.global_step, name, layer, value) for v in views for name, layer, value in v.scalars()]
