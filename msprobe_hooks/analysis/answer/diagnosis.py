"""What kind of cause: the answer after "where" (docs/analysis.md, "What kind of cause").

A module named is half an answer: the gap may come from different inputs, another configuration, MoE routing,
one side's precision, a module's weights or kernel, the sampling after the logits, or the noise of a low precision
with no culprit. :func:`diagnose` reads what ``compare`` already has (:class:`Facts`: the pairs' results and their
:class:`.results.RowFacts`, the samples' log-prob gaps, the run's global steps) and the evidence the engines
recorded (:class:`Evidence`), and runs the rules in order; the first that holds is the diagnosis, and
:func:`unexplained` (``unknown``) when none does. Each rule is one function ``Facts -> Diagnosis | None``.

The order (:data:`DEFAULT_RULES`): inputs and configuration first (everything downstream inherits them), then
routing, precision at the first divergence (a module's dtypes, the rollout's KV cache), module, sampling, the logits'
precision, precision of the whole model, noise, none. Every
threshold is the step rule's floor (:class:`.verdict.StepRule`: ``units`` unit roundoffs of the coarser dtype),
never a number of its own. Evidence one side lacks is "not recorded": no rule decides on it.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from msprobe_hooks.analysis.answer import after_logits
from msprobe_hooks.analysis.answer.run_view import StepView, token_gap
from msprobe_hooks.analysis.answer.symptom import SampleCause
from msprobe_hooks.analysis.answer.verdict import UNIT_ROUNDOFF, StepRule, unit_roundoff
from msprobe_hooks.analysis.comparing.logits import LogitsCheck
from msprobe_hooks.analysis.results import Cause, DiagnosisPath, FirstRule, Mode, PairKind, PairResult, Verdict

DIAGNOSIS_FILE = "diagnosis.json"
SIDES = ("training", "rollout")


@dataclass(frozen=True)
class SideEvidence:
    """What one side recorded about itself, read from its engine's own objects (:mod:`.evidence` reads the files);
    None: not recorded, and the rules that read it never fire on it."""

    configuration: Mapping[str, Any] | None = None  # the model configuration's numerics fields (rope_theta, ...)
    sampling: Mapping[str, Any] | None = None  # temperature, top_k, top_p, min_p, the log-probs mode
    token_ids: Mapping[str, Sequence[int]] | None = None  # request id -> the token ids this side was fed
    numerics: Mapping[str, Any] | None = (
        None  # the engine's settings (engine.jsonl): dtypes of the model, KV cache, head
    )


@dataclass(frozen=True)
class Evidence:
    """Both sides' :class:`SideEvidence`."""

    training: SideEvidence = SideEvidence()
    rollout: SideEvidence = SideEvidence()

    def both(self, name: str) -> tuple[Any, Any] | None:
        """(training, rollout) values of field ``name``; None when either side did not record it."""
        values = getattr(self.training, name), getattr(self.rollout, name)
        return None if None in values else values

    def differing(self, name: str) -> list[tuple[str, Any, Any]]:
        """(key, training, rollout) of the keys of mapping ``name`` both sides recorded, whose values differ."""
        found = self.both(name)
        if found is None:
            return []
        training, rollout = found
        keys = sorted((k for k in training if k in rollout and training[k] != rollout[k]), key=str)
        return [(k, training[k], rollout[k]) for k in keys]


# What each field of :class:`SideEvidence` is, in the words of "not recorded" lines.
RECORDED = {
    "configuration": "the engines' model configurations",
    "sampling": "the sampling parameters",
    "token_ids": "the token ids fed to each side",
}


@dataclass
class Diagnosis:
    """The kind of cause, where (``path``), the module and global step where that applies, and why in numbers."""

    cause: Cause
    path: DiagnosisPath | None = None
    module: str | None = None
    global_step: Any = None
    evidence: list[str] = field(default_factory=list)
    sentence: str = ""

    def record(self) -> dict[str, Any]:
        """``diagnosis.json``'s object."""
        return {
            "cause": self.cause.value,
            "path": self.path.value if self.path is not None else None,
            "module": self.module,
            "global_step": self.global_step,
            "evidence": list(self.evidence),
            "sentence": self.sentence,
        }

    @property
    def line(self) -> str:
        """The report's first line: ``cause: CAUSE (PATH): sentence``, ``(PATH)`` left out where there is none."""
        where = f" ({self.path})" if self.path is not None else ""
        return f"cause: {self.cause}{where}: {self.sentence}"


def _name(dtype: str | None) -> str:
    return (dtype or "?").removeprefix("torch.")


def floor(dtypes: tuple[str, str] | None, rule: StepRule = StepRule()) -> float:  # noqa: B008  (frozen)
    """The step rule's floor for rows of ``dtypes`` (training, inference): the one number every rule here uses."""
    return rule.floor_of(*(dtypes or ()))


def _low_precision(dtypes: tuple[str, str]) -> bool:
    return unit_roundoff(*dtypes) > UNIT_ROUNDOFF["torch.float32"]


def _step_key(step: Any) -> tuple[bool, str, Any]:
    return (step is None, str(type(step)), step)  # run_view's order of global steps


def _first_first(r: PairResult) -> tuple[Any, ...]:
    """Earliest global step, a prefill before a decode token (it explains them), earliest in the model."""
    return (_step_key(r.global_step), r.kind != PairKind.PREFILL, r.first_order, r.pair)


class Found(Protocol):
    """What :func:`diagnose` reads of an :class:`.assemble.Answer` (which imports this module)."""

    @property
    def results(self) -> Sequence[PairResult]: ...
    @property
    def samples(self) -> Sequence[SampleCause]: ...
    @property
    def steps(self) -> Sequence[StepView]: ...
    @property
    def logits(self) -> LogitsCheck | None: ...


@dataclass(frozen=True)
class Facts:
    """What the rules read: the pairs' results, the samples' gaps, the run, the recorded evidence, the response tokens
    checked against the rollout's logits."""

    results: Sequence[PairResult]
    samples: Sequence[SampleCause] = ()
    steps: Sequence[StepView] = ()
    evidence: Evidence = Evidence()
    logits: LogitsCheck | None = None

    @classmethod
    def of(cls, answer: Found, evidence: Evidence | None = None) -> Facts:
        return cls(answer.results, answer.samples, answer.steps, evidence or Evidence(), answer.logits)

    @functools.cached_property
    def after_logits(self) -> after_logits.AfterLogits | None:
        """What each side's log-probs equal of the rollout's logits (None: no token checked)."""
        return after_logits.read(self.logits, self.floor)

    @functools.cached_property
    def compared(self) -> list[PairResult]:
        return [r for r in self.results if r.verdict in (Verdict.DIVERGES, Verdict.NO_DIVERGENCE)]

    @functools.cached_property
    def dtype_counts(self) -> Counter[tuple[str, str]]:
        """(training, inference) dtypes -> compared floating rows, over every pair."""
        counts: Counter[tuple[str, str]] = Counter()
        for r in self.compared:
            counts.update(r.row_facts.dtypes if r.row_facts else {})
        return counts

    @property
    def dtypes(self) -> tuple[str, str] | None:
        """The (training, inference) dtypes of most compared floating rows: the model's."""
        return max(self.dtype_counts, key=lambda pair: (self.dtype_counts[pair], pair), default=None)

    @property
    def dtype_share(self) -> float:
        """The share of compared floating rows in :attr:`dtypes`."""
        total = sum(self.dtype_counts.values())
        dtypes = self.dtypes
        return self.dtype_counts[dtypes] / total if total and dtypes is not None else 0.0

    @property
    def floor(self) -> float:
        return floor(self.dtypes)

    @functools.cached_property
    def stepped(self) -> list[PairResult]:
        """The pairs whose first divergence is a step up of a module's error, first first. A step that follows
        tokens the routers sent elsewhere within the noise (``routing_noise_layer``) is the noise's, not a module's."""
        found = [
            r
            for r in self.compared
            if r.verdict is Verdict.DIVERGES and r.first_rule == FirstRule.STEP and r.routing_noise_layer is None
        ]
        return sorted(found, key=_first_first)

    @functools.cached_property
    def routed(self) -> list[PairResult]:
        """The pairs whose first divergence is routing beyond the noise, first first."""
        return sorted((r for r in self.compared if r.first_rule == FirstRule.ROUTING), key=_first_first)

    @functools.cached_property
    def largest(self) -> PairResult | None:
        measured = [(r.max_error, r) for r in self.compared if r.max_error is not None]
        return max(measured, key=lambda found: found[0], default=(None, None))[1]

    @functools.cached_property
    def gap(self) -> dict[str, float]:
        """The samples' log-prob gap (``logprob_gap.jsonl``): token_gap_mean/max; empty where none was logged."""
        return token_gap([s.gap for s in self.samples if s.gap])

    def first_dtypes(self, r: PairResult) -> tuple[str, str] | None:
        """The dtypes of ``r``'s first divergence where they are not the pair's most common ones, else None."""
        return r.row_facts.other_dtypes.get(f"{r.first_module} {r.first_io}") if r.row_facts else None


Rule = Callable[[Facts], "Diagnosis | None"]


# --- the rules, in their order -------------------------------------------------------------------------


def inputs_differ(facts: Facts) -> Diagnosis | None:
    """The two sides were fed different token ids: by the recorded ids of a request on both sides (the first
    position and both ids), or by an integer row both sides dumped (the embedding's input: its statistics are exact,
    so any error above 0 means other ids)."""
    evidence = []
    found = facts.evidence.both("token_ids")
    if found is not None:
        training, rollout = found
        for request in sorted(set(training) & set(rollout), key=str):
            t, g = list(training[request]), list(rollout[request])
            at = next((i for i, (a, b) in enumerate(zip(t, g, strict=False)) if a != b), min(len(t), len(g)))
            if t != g:
                ids = f"{g[at] if at < len(g) else 'end'} (rollout) vs {t[at] if at < len(t) else 'end'} (training)"
                evidence.append(f"token ids differ from position {at}: {ids} in request {request}")
    differing = [
        (r, row, error)
        for r in facts.compared
        if r.row_facts
        for row, error in r.row_facts.integer_rows.items()
        if error > 0
    ]
    recorded = list(evidence)
    if differing:
        r, row, error = differing[0]
        with_rows = sum(bool(r.row_facts and r.row_facts.integer_rows) for r in facts.compared)
        pairs = len({d[0].pair for d in differing})
        evidence.append(
            f"{row} (integer ids: exact statistics, error 0 when equal) differs in {pairs} of {with_rows} pairs; "
            f"pair {r.pair} ({r.key}): relative error {error:.3g}"
        )
    if not evidence:
        return None
    first = f": {recorded[0]}" if recorded else ""  # the one-line answer names the first position and its ids
    return Diagnosis(
        Cause.INPUTS,
        global_step=differing[0][0].global_step if differing else None,
        evidence=evidence,
        sentence=f"the two sides were fed different token ids{first}; every module downstream inherits it",
    )


def configuration_differs(facts: Facts) -> Diagnosis | None:
    """The engines' model configurations, both recorded, differ in a numerics field."""
    differing = facts.evidence.differing("configuration")
    if not differing:
        return None
    evidence = [f"{key} {rollout} (rollout) vs {training} (training)" for key, training, rollout in differing]
    return Diagnosis(
        Cause.CONFIGURATION,
        evidence=evidence,
        sentence=f"the engines' model configurations differ: {evidence[0]}",
    )


def routing_differs(facts: Facts) -> Diagnosis | None:
    """A pair's first divergence is its MoE routers sending tokens to other experts beyond the near-tie noise."""
    if not facts.routed:
        return None
    r = facts.routed[0]
    layer = next((x for x in r.routing if x.layer == r.routing_layer), None)
    evidence = [f"routing first in {len(facts.routed)} of {len(facts.compared)} pairs"]
    if layer is not None:
        evidence.insert(
            0,
            f"pair {r.pair} ({r.key}): {layer.flipped} of {layer.tokens} tokens ({layer.share:.1%}) at layer "
            f"{layer.layer} go to other experts, {layer.beyond_noise} at top-k margins above the logits' noise "
            f"({layer.noise:.3g})",
        )
    if r.numeric_first:
        evidence.append(f"the numbers diverge from {r.numeric_first} on, after the router")
    return Diagnosis(
        Cause.ROUTING,
        _path(r),
        r.first_module,
        r.global_step,
        evidence,
        f"tokens go to other experts from layer {r.routing_layer} ({r.first_module}) beyond the near-tie noise",
    )


def precision_at_divergence(facts: Facts) -> Diagnosis | None:
    """The first module that steps up runs in other dtypes on the two sides, where the rows before it agree on the
    model's (e.g. an lm_head in float32 on one side only)."""
    if not facts.stepped:
        return None
    r = facts.stepped[0]
    dtypes = facts.first_dtypes(r)
    if dtypes is None or dtypes[0] == dtypes[1]:
        return None
    model = r.row_facts.common if r.row_facts else None
    named = f"{r.first_module} {r.first_io}"
    evidence = [
        f"{named} {_name(dtypes[1])} (rollout) vs {_name(dtypes[0])} (training); the model's rows "
        f"{_name(model[1]) if model else '?'} (rollout) / {_name(model[0]) if model else '?'} (training)",
        f"{named} steps up to {r.first_error:.3g} from {r.first_before or 0:.3g} before it "
        f"(floor {floor(dtypes):.3g}); every earlier module within its floor",
    ]
    return Diagnosis(
        Cause.PRECISION,
        _path(r),
        r.first_module,
        r.global_step,
        evidence + _since(facts, r),
        f"{named} runs in {_name(dtypes[1])} (rollout) vs {_name(dtypes[0])} (training), where the error steps up",
    )


def _attention_core(module: str, io: str) -> bool:
    """The attention core's output (o_proj's input): what reads the KV cache."""
    return module.endswith(".attn") or (module.endswith(".o_proj") and io == "input")


def kv_cache_precision(facts: Facts) -> Diagnosis | None:
    """The rollout's KV cache holds a coarser dtype than its model computes in (``kv_cache_dtype``, engine.jsonl),
    and the first step up is the attention core, which reads the cache, while the projections before it agree."""
    numerics = facts.evidence.rollout.numerics or {}
    cache, model = numerics.get("kv_cache_dtype"), numerics.get("model_dtype")
    if cache in (None, "auto", model) or not facts.stepped:
        return None
    r = facts.stepped[0]
    if not _attention_core(r.first_module, r.first_io):
        return None  # another module steps first: its own cause
    named = f"{r.first_module} {r.first_io}"
    evidence = [
        f"KV cache {cache} (rollout; its model computes in {model}, engine.jsonl)",
        f"{named}, which reads the cache, steps up to {r.first_error:.3g} from {r.first_before or 0:.3g} before it: "
        "q, k and v agree within their floor",
        f"first divergence in {sum(f'{x.first_module} {x.first_io}' == named for x in facts.stepped)} of "
        f"{len(facts.compared)} compared pairs",
    ]
    return Diagnosis(
        Cause.PRECISION,
        _path(r),
        r.first_module,
        r.global_step,
        evidence + _since(facts, r),
        f"the rollout's KV cache is {cache}: q/k/v agree, the attention output read from it diverges at {named}",
    )


def module_steps_up(facts: Facts) -> Diagnosis | None:
    """A module's error steps up over its floor on the dtypes of the rows before it: its weights or its kernel; on
    the prefill or the decode path, and with several global steps, since which one."""
    if not facts.stepped:
        return None
    r = facts.stepped[0]
    dtypes = facts.first_dtypes(r)
    if dtypes is not None and dtypes[0] != dtypes[1]:
        return None  # precision_at_divergence's
    named = f"{r.first_module} {r.first_io}"
    same = sum(f"{x.first_module} {x.first_io}" == named for x in facts.stepped)
    model = r.row_facts.common if r.row_facts else None
    dtype_words = f"{_name(model[0])} (training) / {_name(model[1])} (rollout)" if model else "?"
    evidence = [
        f"{named} steps up to {r.first_error:.3g} from {r.first_before or 0:.3g} before it (floor {floor(model):.3g}); "
        f"dtypes {dtype_words} as the rows before it",
        f"first divergence in {same} of {len(facts.compared)} compared pairs",
    ]
    kind = _path(r)
    if kind is DiagnosisPath.DECODE:
        prefill = [x for x in facts.compared if x.kind == PairKind.PREFILL]
        evidence.append(
            f"decode tokens only: {len(prefill)} prefill pairs compared, none diverges"
            if prefill
            else "decode tokens only: no prefill pair compared"
        )
    since = _since(facts, r)
    return Diagnosis(
        Cause.MODULE,
        kind,
        r.first_module,
        r.global_step,
        evidence + since + _gap_lines(facts),
        f"{named} computes differently on agreeing inputs (its weights or its kernel)"
        + (f", from global step {r.global_step} on" if since else ""),
    )


def _or_off(value: Any) -> Any:
    """A sampling field's value as the evidence says it: None is a filter not applied (no top-k)."""
    return "off" if value is None else value


def sampling_differs(facts: Facts) -> Diagnosis | None:
    """The modules agree, and the log-probs are made differently from the logits: by the rollout's values against its
    own logits where its sampling steps were dumped in tensor mode (off ``log_softmax(logits / T)`` at training's
    temperature by over twice training's own distance: :mod:`.after_logits`), else by the sampling parameters both
    sides recorded. Where the values equal training's transform, differing parameters change nothing returned: not
    this rule's."""
    if not facts.compared or facts.stepped or facts.routed:
        return None
    view = facts.after_logits
    if view is not None and view.alike:
        return None  # the engines' own values: one transform of logits that agree, whatever the parameters say
    differing = facts.evidence.differing("sampling")
    if not differing and (view is None or not view.differ):
        return None
    evidence = [
        f"{key} {_or_off(rollout)} (rollout) vs {_or_off(training)} (training)" for key, training, rollout in differing
    ]
    mode = (facts.evidence.rollout.numerics or {}).get("logprobs_mode")
    if mode is not None and differing:
        evidence.append(
            f"the rollout returns {mode} (its engine's log-probs mode): the log-probs of the logits as sampled "
            "(divided by the temperature, renormalised over top-k / top-p / min-p) when processed, of the raw logits "
            "when raw; training recomputes log_softmax(logits / temperature) and never applies a nucleus"
        )
    evidence += _logits_lines(facts)
    evidence.append(_agree(facts))
    return Diagnosis(
        Cause.SAMPLING,
        DiagnosisPath.AFTER_LOGITS,
        evidence=evidence + _gap_lines(facts),
        sentence=f"the modules agree; the log-probs are made differently from the logits: {evidence[0]}",
    )


def logits_precision(facts: Facts) -> Diagnosis | None:
    """The modules agree (nothing steps up) in one dtype on both sides; the two engines' logits are computed in other
    dtypes (the rollout's ``head_dtype``, the training forward's observed ``logits_dtype``, engine.jsonl): msprobe
    compares no logits under verl, so the recorded dtypes say it. Where the model's rows differ in dtype too (vLLM's
    head_dtype defaults to its model's), the logits only follow the whole model: :func:`model_precision`'s."""
    rollout = (facts.evidence.rollout.numerics or {}).get("head_dtype")
    training = (facts.evidence.training.numerics or {}).get("logits_dtype")
    if rollout is None or training is None or rollout == training or facts.stepped or facts.routed:
        return None
    dtypes = facts.dtypes
    if dtypes is None or dtypes[0] != dtypes[1]:
        return None
    return Diagnosis(
        Cause.PRECISION,
        DiagnosisPath.AFTER_LOGITS,
        "lm_head",
        evidence=[
            f"lm_head output {rollout} (rollout) vs {training} (training) (engine.jsonl: vLLM's head dtype, the "
            "dtype training's logits came out in)",
            _agree(facts),
            *_gap_lines(facts),
        ],
        sentence=f"the logits are computed in {rollout} (rollout) vs {training} (training); every earlier module "
        "agrees within its floor",
    )


def _whole_model(facts: Facts, cause: Cause, dtypes_line: str, sentence: str) -> Diagnosis:
    """A cause of the whole model's dtypes, no module stepping up: its dtypes, that the errors agree, the routing
    flips within the noise, the gap."""
    evidence = [f"{dtypes_line} on {facts.dtype_share:.0%} of the compared rows", _agree(facts)]
    return Diagnosis(cause, evidence=evidence + _noise_flips(facts) + _gap_lines(facts), sentence=sentence)


def model_precision(facts: Facts) -> Diagnosis | None:
    """Most compared rows are in another dtype on one side, and no module steps up: the whole model's precision."""
    dtypes = facts.dtypes
    if dtypes is None or dtypes[0] == dtypes[1] or facts.stepped or facts.routed:
        return None
    training, rollout = _name(dtypes[0]), _name(dtypes[1])
    return _whole_model(
        facts,
        Cause.PRECISION,
        f"model dtype {training} (training) vs {rollout} (rollout)",
        f"the model runs in {training} (training) vs {rollout} (rollout); no module steps out of that noise",
    )


def noise_floor(facts: Facts) -> Diagnosis | None:
    """Both sides in one low precision, no module steps up: the noise of that precision, no single culprit.
    Routing flips within the noise are reported here, never blamed."""
    dtypes = facts.dtypes
    if dtypes is None or dtypes[0] != dtypes[1] or not _low_precision(dtypes) or facts.stepped or facts.routed:
        return None
    return _whole_model(
        facts,
        Cause.NOISE,
        f"model dtype {_name(dtypes[0])} on both sides",
        f"every error grows smoothly within the {_name(dtypes[0])} noise: no single culprit",
    )


def nothing_differs(facts: Facts) -> Diagnosis | None:
    """fp32 (or finer) on both sides, no pair diverges, and no logged log-prob gap beyond the same floor."""
    dtypes = facts.dtypes
    if dtypes is None or dtypes[0] != dtypes[1] or _low_precision(dtypes):
        return None
    if not facts.compared or any(r.verdict is Verdict.DIVERGES for r in facts.compared):
        return None
    gap = facts.gap.get("token_gap_max")
    if gap is not None and gap > facts.floor:
        return None  # unexplained's: a gap nothing compared explains
    return Diagnosis(
        Cause.NONE,
        evidence=[f"model dtype {_name(dtypes[0])} on both sides", _agree(facts), *_gap_lines(facts)],
        sentence=f"nothing differs beyond the {_name(dtypes[0])} floor",
    )


DEFAULT_RULES: tuple[Rule, ...] = (
    inputs_differ,
    configuration_differs,
    routing_differs,
    precision_at_divergence,
    kv_cache_precision,
    module_steps_up,
    sampling_differs,
    logits_precision,
    model_precision,
    noise_floor,
    nothing_differs,
)


def unexplained(facts: Facts) -> Diagnosis:
    """What no rule explains (``unknown``): what diverges or how large the gap is, what was not compared, and
    which dump would show it."""
    if not facts.compared:
        evidence = [f"no pair could be compared ({len(facts.results)} pairs: failed, nothing compared, or statistics)"]
        sentence = "no pair could be compared"
    else:
        gap = facts.gap.get("token_gap_max")
        diverging = [r for r in facts.compared if r.verdict is Verdict.DIVERGES]
        evidence = [_agree(facts)] if not diverging else []
        evidence += [
            f"pair {r.pair} ({r.key}): {r.first_module} {r.first_io} crosses the fixed threshold at {r.first_error:.3g}"
            " without a step up over its floor"
            for r in diverging[:3]
        ]
        evidence += _gap_lines(facts)
        sentence = (
            f"a log-prob gap of {gap:.3g} beyond the floor {facts.floor:.3g} that no compared module explains"
            if gap is not None and gap > facts.floor
            else "a divergence no rule explains"
        )
    if facts.after_logits is None:
        evidence.append(
            "not compared: the logits (msprobe skips lm_head under verl): a tensor-mode dump of the rollout's sampling "
            "steps, with the per-token log-probs in the gap log (MSPROBE_HOOKS_GAP_TOKENS), checks both sides' "
            "log-probs against the rollout's logits"
        )
        evidence += after_logits.not_checked(facts.logits)
    return Diagnosis(Cause.UNKNOWN, evidence=evidence, sentence=sentence)


def diagnose(answer: Found, rules: Sequence[Rule] = DEFAULT_RULES, evidence: Evidence | None = None) -> Diagnosis:
    """The first of ``rules`` that holds on ``answer`` (and the engines' ``evidence``), else :func:`unexplained`;
    its evidence ends with what was not recorded on either side."""
    facts = Facts.of(answer, evidence)
    return diagnose_facts(facts, rules)


def diagnose_facts(facts: Facts, rules: Sequence[Rule] = DEFAULT_RULES) -> Diagnosis:
    """:func:`diagnose` on :class:`Facts` already gathered: the rule's evidence, then what each side's log-probs are of
    (where a rule did not decide on it), then what was not recorded."""
    found = next((d for d in (rule(facts) for rule in rules) if d is not None), None) or unexplained(facts)
    found.evidence += [line for line in _logits_lines(facts) if line not in found.evidence]
    found.evidence += _not_recorded(facts)
    return found


# --- evidence lines ------------------------------------------------------------------------------------


def _path(r: PairResult) -> DiagnosisPath:
    return DiagnosisPath.DECODE if r.kind == PairKind.DECODE else DiagnosisPath.PREFILL


def _agree(facts: Facts) -> str:
    """The largest error, and that no row steps over the floor and twice the largest before it."""
    largest = facts.largest
    if largest is None or largest.max_error is None:
        return "no compared row"
    dtype = _name(max(facts.dtypes or ("",), key=lambda d: UNIT_ROUNDOFF.get(d, 0.0)))
    within = largest.max_error <= facts.floor
    return (
        f"{'every error within the ' + dtype + ' floor' if within else 'errors grow smoothly'}: largest "
        f"{largest.max_error:.3g} ({largest.max_module}, pair {largest.pair}), floor {facts.floor:.3g} "
        f"({StepRule().units:g} x unit roundoff of {dtype}); no row steps above it and twice the largest before it "
        f"in {len(facts.compared)} pairs"
    )


def _noise_flips(facts: Facts) -> list[str]:
    flips = [x for r in facts.compared for x in r.routing if x.within_noise]
    following = [r for r in facts.compared if r.routing_noise_layer is not None]
    lines = []
    if flips:
        lines.append(
            f"routing: {sum(x.within_noise or 0 for x in flips)} tokens change experts, all at top-k margins within "
            f"the logits' noise ({flips[0].noise:.3g}): not a cause"
        )
    lines += [
        f"pair {r.pair} ({r.key}): {r.first_module} {r.first_io} steps up after tokens at layer "
        f"{r.routing_noise_layer} went to other experts within the noise: noise, not a module"
        for r in following
    ]
    return lines


def _logits_lines(facts: Facts) -> list[str]:
    return facts.after_logits.lines() if facts.after_logits is not None else []


def _gap_lines(facts: Facts) -> list[str]:
    gap = facts.gap
    if not gap:
        return []
    samples = sum(bool(s.gap) for s in facts.samples)
    return [
        f"log-prob gap over {samples} samples (logprob_gap.jsonl): mean {gap['token_gap_mean']:.3g}, "
        f"max {gap['token_gap_max']:.3g}"
    ]


def _since(facts: Facts, r: PairResult) -> list[str]:
    """With several global steps: the first to diverge, and the clean ones compared before it."""
    if len([v for v in facts.steps if v.global_step is not None]) < 2:
        return []
    before = [
        v
        for v in facts.steps
        if v.verdict is Verdict.NO_DIVERGENCE and _step_key(v.global_step) < _step_key(r.global_step)
    ]
    if not before:
        return []
    return [f"global step {r.global_step} is the first to diverge; {len(before)} compared steps before it clean"]


def _not_recorded(facts: Facts) -> list[str]:
    lines = []
    for name, words in RECORDED.items():
        missing = [side for side in SIDES if getattr(getattr(facts.evidence, side), name) is None]
        if missing:
            lines.append(f"not recorded: {words} ({', '.join(missing)})")
    with_ids = [r for r in facts.compared if r.row_facts and r.row_facts.integer_rows]
    if facts.evidence.both("token_ids") is None and with_ids:
        integer_rows = [r.row_facts.integer_rows for r in with_ids if r.row_facts]
        equal = sum(all(e == 0 for e in errors.values()) for errors in integer_rows)
        rows = sorted({row for errors in integer_rows for row in errors})
        statistics = sum(r.mode is Mode.STATISTICS for r in with_ids)
        # msprobe's statistics of an integer tensor are its max and min only: an id changed between them is unseen
        seen = f" ({statistics} by their max and min only: a changed id between them is not seen)" if statistics else ""
        lines.append(f"token ids compared through {', '.join(rows)}: equal in {equal} of {len(with_ids)} pairs{seen}")
    return lines
