"""What each side's log-probs are of, read from the rollout's own logits (:mod:`..comparing.logits`' numbers).

A side's values equal a transform when every checked token is within its tolerance of it. The rollout's are checked
against its own logits row, the very numbers it sampled from: what is left is float rounding, so the tolerance is the
float32 floor scaled by the largest logit over the temperature (a log-softmax's rounding grows with its inputs).
Training's recomputed ones come through its own model: the tolerance is the model's floor (:func:`.diagnosis.floor`
of the compared rows' dtypes), scaled alike. Both add the gap line's rounding (``GAP_TOKEN_DECIMALS``).

Then: the rollout's values equal ``log_softmax(logits / T)`` at training's temperature: one transform on both sides
(``alike``), whatever the recorded parameters say. They are off it, by more than the step rule's factor times
training's own values are (training's distance is the logits' noise through its model: 1e-6 in fp32, up to tenths
in a large bf16 model): the same logits made into log-probs two ways (``differ``: a sampling cause, after the
logits). Neither: the transform's difference is within the logits' noise, and the recorded parameters decide.
Training's values off their transform beyond their tolerance are said as the logits differing (precision, a
module).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from msprobe_hooks.analysis.answer.verdict import StepRule
from msprobe_hooks.analysis.comparing.logits import (
    RAW,
    ROLLOUT_SAMPLING,
    ROLLOUT_TEMPERATURE,
    TRAINING_TEMPERATURE,
    LogitsCheck,
    TokenAtLogits,
)
from msprobe_hooks.join_keys import GAP_TOKEN_DECIMALS

ROUNDING = 0.5 * 10.0**-GAP_TOKEN_DECIMALS  # the gap line's per-token values are rounded to these decimals


@dataclass(frozen=True)
class Match:
    """One side's values against one transform of the rollout's logits, over the checked tokens."""

    name: str  # the transform, as its first token names it ("log_softmax(logits / 0.8)")
    within: int  # tokens within the tolerance
    tokens: int
    largest: float  # the largest |value - transform's value|

    @property
    def equal(self) -> bool:
        return self.within == self.tokens

    def words(self) -> str:
        share = f"all {self.tokens}" if self.equal else f"{self.within} of {self.tokens}"
        return f"{self.name} to {self.largest:.2g} on {share} response tokens checked"


def _match(tokens: Sequence[TokenAtLogits], role: str, side: str, tolerance: float) -> Match | None:
    held = [t for t in tokens if role in t.values]
    if len(held) < len(tokens) or not held:
        return None  # a transform not computed for every token (its sampling not recorded) decides nothing
    deviations = [(abs(getattr(t, side) - t.values[role][1]), ROUNDING + tolerance * max(1.0, t.scale)) for t in held]
    names = {t.values[role][0] for t in held}
    name = names.pop() if len(names) == 1 else f"log_softmax of {role} (per request)"
    return Match(name, sum(d <= tol for d, tol in deviations), len(held), max(d for d, _ in deviations))


@dataclass(frozen=True)
class AfterLogits:
    """The rollout's values against each transform (best first), training's against its temperature's, on the rollout's
    logits; what was not checked."""

    dtype: str
    rollout: list[Match]
    training: Match
    rollout_at_training: Match  # the rollout's values against training's transform, at the rollout's own tolerance
    factor: float  # the step rule's: how far above training's own distance from it the rollout's must be
    claimed: str | None  # what the rollout's mode and parameters say it returns (one for all tokens), None: not said
    sampling_recorded: bool  # every token's request's sampling parameters recorded (requests.jsonl)
    not_checked: list[str]

    @property
    def alike(self) -> bool:
        """The rollout's values are training's transform of its logits: one transform on both sides."""
        return self.rollout_at_training.equal

    @property
    def differ(self) -> bool:
        """The rollout's values are off training's transform of the logits by more than ``factor`` times training's
        own values are: the gap is the transform, not the logits' noise (which a bf16 model's can be)."""
        return not self.alike and self.rollout_at_training.largest > self.factor * self.training.largest

    def lines(self) -> list[str]:
        """The evidence, in numbers."""
        best = self.rollout[0]
        tried = ", ".join(m.name for m in self.rollout)
        why = (
            "its sampling parameters not recorded (requests.jsonl): no other transform tried"
            if not self.sampling_recorded
            else "something after its logits changed them: penalties, a logits processor"
        )
        found = (
            f"the rollout's log-probs equal {best.words()}"
            if best.equal
            else f"the rollout's log-probs equal none of {tried}: closest {best.words()} ({why})"
        )
        lines = [f"{found} (its own logits, {self.dtype}, from its dumped sampling steps)"]
        if self.claimed is not None and best.equal and self.claimed != best.name:
            lines.append(f"its log-probs mode and sampling parameters say {self.claimed}")
        if self.training.equal:
            agree = "the two engines' logits agree"
            lines.append(f"training's recomputed log-probs equal {self.training.words()}: {agree}")
        else:
            lines.append(
                f"training's recomputed log-probs are off {self.training.name} of the rollout's logits by up to "
                f"{self.training.largest:.3g} ({self.training.tokens - self.training.within} of {self.training.tokens} "
                "tokens beyond the noise): the logits differ"
            )
        if self.differ:
            lines.append(
                f"the rollout's are off {self.training.name} by up to {self.rollout_at_training.largest:.3g}, over "
                f"{self.factor:g} x training's {self.training.largest:.2g}: the same logits made into log-probs two "
                "ways"
            )
        return lines + self.not_checked


def read(check: LogitsCheck | None, model_floor: float, rule: StepRule = StepRule()) -> AfterLogits | None:  # noqa: B008
    """The check's tokens as :class:`AfterLogits` (``model_floor``: the compared rows' floor); None when no token was
    checked."""
    if check is None or not check.tokens:
        return None
    tokens = check.tokens
    own = rule.floor_of("torch.float32")  # the rollout's values against the numbers it sampled from: float32 rounding
    roles = (ROLLOUT_SAMPLING, ROLLOUT_TEMPERATURE, RAW, TRAINING_TEMPERATURE)
    rollout = [m for role in roles if (m := _match(tokens, role, "rollout", own))]
    rollout.sort(key=lambda m: (not m.equal, m.largest))
    training = _match(tokens, TRAINING_TEMPERATURE, "training", model_floor)
    at_training = _match(tokens, TRAINING_TEMPERATURE, "rollout", own)
    assert training is not None and at_training is not None  # computed for every token
    claims = {t.claimed for t in tokens}
    return AfterLogits(
        dtype=", ".join(sorted({t.dtype for t in tokens})),
        rollout=_distinct(rollout),
        training=training,
        rollout_at_training=at_training,
        factor=rule.factor,
        claimed=claims.pop() if len(claims) == 1 else None,
        sampling_recorded=all(ROLLOUT_SAMPLING in t.values for t in tokens),
        not_checked=not_checked(check),
    )


def not_checked(check: LogitsCheck | None) -> list[str]:
    """Why pairs' tokens could not be checked against the rollout's logits: the three commonest reasons."""
    found = check.not_checked.most_common(3) if check is not None else []
    return [f"logits not checked for {n} pairs: {why}" for why, n in found]


def _distinct(matches: list[Match]) -> list[Match]:
    """One match per transform name (the roles coincide: a temperature of 1, no nucleus)."""
    seen: dict[str, Match] = {}
    for m in matches:
        seen.setdefault(m.name, m)
    return list(seen.values())
