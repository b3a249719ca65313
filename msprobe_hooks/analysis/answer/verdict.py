"""Where a pair's computations part: the verdict of a pair, decided once, by the rules it is handed.

:func:`judge` takes a compared pair (its :class:`.results.PairResult` as comparing filled it in, and its rows)
and the rules, built once per ``compare`` (:func:`rules`, as NVIDIA Polygraphy is handed its compare function),
and decides the verdict and the first divergence. The numeric rules read the compared rows of a pair in the
training model's order (``error`` = the relative error of max/min/norm, or ``||a - b|| / ||b||`` in tensor mode):

* :class:`StepRule` (the primary one): the first row whose error **steps up** against the pair's own
  noise floor, i.e. exceeds both an absolute floor and ``factor`` times the largest error of every
  earlier row. The floor follows the coarser of the two dtypes (``units`` unit roundoffs: bf16
  computations differ by ~1e-2 for the same maths, fp32 by ~1e-6), never below ``minimum``. A fault
  stands out against what came before it even when it is small (a 3 % change of ``up_proj`` is 1.4 %
  of the fused ``gate_up_proj`` statistics) and noise that grows smoothly with depth does not.
* :class:`FixedRule` (``--threshold``): the first row whose error exceeds a fixed threshold.

When the two name different rows, the report says both. :class:`RoutingRule` reads the MoE routers' choices
that comparing took (:mod:`.comparing.routing`): a flip is **within noise** when the training logits' top-k
margin at that token is at most ``2 * eps * max|logit|`` of that token, ``eps`` the larger of the step rule's
floor for the router output's dtypes (fp32 1e-4, bf16 1.6e-2) and the relative error measured at the router's
input: the two experts at the edge are then closer than what rounding moves a logit by (each by up to
``eps * max|logit|``), so rounding alone can swap them. Those flips are reported, never blamed; unless the
router's own output already diverges numerically (steps up, or crosses the threshold): its logits then differ by
more than rounding, and every flip of that layer counts. The first layer with a flip beyond the noise is where
routing diverges; when it comes at or before the numeric first divergence (the router's own logits diverging
*is* that layer's routing), it becomes the pair's first divergence: "routing diverges at layer k".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from msprobe_hooks.analysis.results import (
    DEFAULT_THRESHOLD,
    FirstRule,
    ModuleRow,
    PairResult,
    RoutingLayer,
    Status,
    Verdict,
)

# Unit roundoff (half an ulp at 1.0) of the floating dtypes msprobe writes, by the names it writes them.
UNIT_ROUNDOFF = {
    "torch.float64": 2.0**-53,
    "torch.float32": 2.0**-24,
    "torch.float16": 2.0**-11,
    "torch.bfloat16": 2.0**-8,
}


def unit_roundoff(*dtypes: str | None) -> float:
    """The coarsest unit roundoff among ``dtypes`` (fp32's when none is a known float dtype)."""
    known = [UNIT_ROUNDOFF[d] for d in dtypes if d in UNIT_ROUNDOFF]
    return max(known, default=UNIT_ROUNDOFF["torch.float32"])


def _compared(rows: Sequence[ModuleRow]) -> list[tuple[ModuleRow, float]]:
    """The compared rows, each with its error."""
    return [(r, r.error) for r in rows if r.status is Status.COMPARED and r.error is not None]


@dataclass(frozen=True)
class Finding:
    """A pair's first divergence as a rule names it: where (in the training model's order), and by which rule."""

    rule: FirstRule
    module: str
    io: str
    error: float | None
    order: int
    layer: int | None
    train_name: str
    generate_name: str

    @classmethod
    def of_row(cls, rule: FirstRule, row: ModuleRow) -> Finding:
        return cls(
            rule,
            row.module or "",
            row.io or "",
            row.error,
            row.order,
            row.layer,
            row.train_name or "",
            row.generate_name or "",
        )


class Rule(Protocol):
    """One rule of the verdict: handed the pair, its rows and the first divergence the rules before it named
    (None: none), it returns the pair's first divergence: that one, or its own where it has the say."""

    def apply(self, result: PairResult, rows: Sequence[ModuleRow], named: Finding | None) -> Finding | None: ...


@dataclass(frozen=True)
class FixedRule:
    """A row diverges when its error exceeds ``threshold`` (its ``diverges`` flag); it names the first divergence
    where no rule before it did, and is reported beside another rule's (``PairResult.threshold_*``)."""

    threshold: float = DEFAULT_THRESHOLD

    def apply(self, result: PairResult, rows: Sequence[ModuleRow], named: Finding | None) -> Finding | None:
        fixed = None
        for row, error in _compared(rows):
            row.diverges = error > self.threshold
            if row.diverges and fixed is None:
                fixed = row
        if fixed is None:
            return named
        result.threshold_module, result.threshold_io = fixed.module or "", fixed.io or ""
        result.threshold_error = fixed.error
        return named or Finding.of_row(FirstRule.THRESHOLD, fixed)


@dataclass(frozen=True)
class StepRule:
    """A row diverges when its error exceeds its floor and ``factor`` times every earlier row's error.

    The floor of a row is ``max(minimum, units * unit_roundoff(train dtype, inference dtype))``: 1e-4
    for fp32, 1.6e-2 for bf16. Measured on real pairs (docs/analysis.md, "The verdict"): identical
    weights, fp32 on both sides, errors <= 1.3e-6 everywhere; vLLM in bf16 against fp32 training, errors
    grow smoothly with depth to ~1.2e-2, no row above the floor more than 1.7x the largest before it;
    planted changes of 1-5 % (fp32) and 2-5 % (bf16), fused or not, 2.2x-10^5x.
    """

    factor: float = 2.0
    units: float = 4.0
    minimum: float = 1e-4

    def floor(self, row: ModuleRow) -> float:
        return self.floor_of(row.train_dtype, row.generate_dtype)

    def floor_of(self, *dtypes: str | None) -> float:
        """The floor of rows of these (training, inference) dtypes."""
        return max(self.minimum, self.units * unit_roundoff(*dtypes))

    def steps(self, rows: Sequence[ModuleRow]) -> list[tuple[ModuleRow, float, bool]]:
        """Each compared row, in order, its error, and whether it steps up."""
        out, largest = [], 0.0
        for row, error in _compared(rows):
            out.append((row, error, error > max(self.floor(row), self.factor * largest)))
            largest = max(largest, error)
        return out

    def apply(self, result: PairResult, rows: Sequence[ModuleRow], named: Finding | None) -> Finding | None:
        """Each compared row's ``steps_up`` flag; the first step names the first divergence where no rule before
        this one did (``PairResult.first_before``: the largest error before it)."""
        stepped, before = None, 0.0
        for row, error, up in self.steps(rows):
            row.steps_up = up
            if up and stepped is None:
                stepped, result.first_before = row, before
            before = max(before, error)
        return named or (Finding.of_row(FirstRule.STEP, stepped) if stepped is not None else None)


def _row(rows: Sequence[ModuleRow], module: str, io: str) -> ModuleRow | None:
    return next((r for r in rows if r.module == module and r.io == io), None)


@dataclass(frozen=True)
class RoutingRule:
    """Routing diverges at the first MoE layer whose router sent a token to other experts beyond the logits'
    noise (``floor``: the step rule whose floor the noise starts from); it names the pair's first divergence
    when that comes at or before the first divergence the rules before it named. List it after them: it reads
    their flags on the router's output row."""

    floor: StepRule = StepRule()

    def noise(self, layer: RoutingLayer, rows: Sequence[ModuleRow]) -> None:
        """``layer``'s noise, and which of its flips are within it."""
        output, given = _row(rows, layer.router, "output"), _row(rows, layer.router, "input")
        eps = self.floor.floor(output) if output is not None else self.floor.minimum
        if given is not None and given.error is not None:
            eps = max(eps, given.error)
        layer.noise = eps
        # Logits that the numeric comparison already found diverging (the router's output steps up, or crosses the
        # threshold) differ by more than rounding: none of that layer's flips is noise, whatever its margin.
        router_diverges = output is not None and bool(output.steps_up or output.diverges)
        margins = layer.margins if not router_diverges else None
        layer.within_noise = sum(margin <= 2 * eps * largest for margin, largest in margins or ())
        layer.beyond_noise = (layer.flipped or 0) - layer.within_noise
        if margins:
            layer.margin_min = min(margin for margin, _ in margins)

    def apply(self, result: PairResult, rows: Sequence[ModuleRow], named: Finding | None) -> Finding | None:
        compared = [r for r in result.routing if r.status is Status.COMPARED]
        for layer in compared:
            self.noise(layer, rows)
        first = next((r for r in compared if r.beyond_noise), None)
        noisy = {r.layer: r for r in compared if r.flipped and not r.beyond_noise}
        if named is not None and (first is None or (first.layer or 0) > (named.layer or 0)):
            flipped = noisy.get(named.layer)
            router_output = _row(rows, flipped.router, "output") if flipped is not None else None
            if router_output is not None and named.order >= router_output.order:
                result.routing_noise_layer = named.layer  # the block's output moved for tokens rounding sent elsewhere
        if first is None:
            return named
        result.routing_layer, result.routing_share = first.layer, first.share
        router_output = _row(rows, first.router, "output")
        if router_output is None or (named is not None and named.order < router_output.order):
            return named  # a numeric divergence before the router: routing is its consequence
        if named is not None:
            result.numeric_first = f"{named.module} {named.io}"
        return Finding(
            FirstRule.ROUTING,
            first.router,
            "routing",
            first.share,
            router_output.order,
            first.layer,
            first.train_source or "",
            first.generate_source or "",
        )


def rules(threshold: float = DEFAULT_THRESHOLD) -> tuple[Rule, ...]:
    """The rules ``compare`` judges by: the step rule first, the fixed threshold, then routing."""
    step = StepRule()
    return (step, FixedRule(threshold), RoutingRule(step))


def judge(result: PairResult, rows: Sequence[ModuleRow], rules: Sequence[Rule]) -> None:
    """Decide a compared pair's verdict and first divergence by ``rules``, in order, each handed what the ones
    before it named; the rows get the rules' flags. A pair that could not be compared (failed, or statistics where
    a token's rows were to be cut) keeps what comparing said."""
    if result.verdict in (Verdict.FAILED, Verdict.STATISTICS):
        return
    first: Finding | None = None
    for rule in rules:
        first = rule.apply(result, rows, first)
    if first is None:
        result.verdict = Verdict.NO_DIVERGENCE if result.compared else Verdict.NOTHING_COMPARED
        return
    result.verdict, result.first_rule = Verdict.DIVERGES, first.rule
    result.first_module, result.first_io, result.first_error = first.module, first.io, first.error
    result.first_order, result.first_layer = first.order, first.layer
    result.first_train_name, result.first_generate_name = first.train_name, first.generate_name
