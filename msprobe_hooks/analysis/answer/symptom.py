"""From the symptom to the cause: the log-prob gap per sample, and where its computations part.

The symptom is what an RL engineer sees on the dashboard: verl's ``training/rollout_probs_diff_*``, the
gap between the training engine's and the rollout's log-probs on the response tokens, which the
training side writes per sample into ``logprob_gap.jsonl`` (``msprobe_hooks.join_keys.GAP_LOG``). The
cause is in the pairs: a prefill pair (the prompt) and decode pairs (one response token each). A
divergence at prefill is on a path both see (it shows at every decode token too); one only at the
decode tokens is on the decode path (paged KV cache, single-token attention, a decode-only kernel).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from msprobe_hooks.analysis.results import GAP_FIELDS, CausePath, PairKind, PairResult, Verdict
from msprobe_hooks.join_keys import strip_vllm_suffix
from msprobe_hooks.jsonl import records


@dataclass
class SampleCause:
    """One sample (request, global step): its gap, and the first divergence at prefill and per decode token."""

    key: str
    global_step: object = None
    gap: dict[str, object] = field(default_factory=dict)  # GAP_FIELDS of its logprob_gap.jsonl line
    prefill: PairResult | None = None
    decode: list[PairResult] = field(default_factory=list)  # by token_index

    @property
    def decode_diverging(self) -> list[PairResult]:
        return [r for r in self.decode if r.verdict is Verdict.DIVERGES]

    @property
    def path(self) -> CausePath | None:
        """Where this sample's divergence is, or None when nothing of it was compared."""
        compared = [r for r in [self.prefill, *self.decode] if r is not None and r.compared]
        if not compared:
            return None
        if self.prefill is not None and self.prefill.verdict is Verdict.DIVERGES:
            return CausePath.PREFILL
        return CausePath.DECODE if self.decode_diverging else CausePath.NEITHER


def gap_lines(paths: Iterable[str]) -> Iterator[dict[str, object]]:
    """Every record of the gap logs ``paths`` (the pairs' ``train.gap_logs``), in order; a bad line is named and
    skipped (:func:`msprobe_hooks.jsonl.records`)."""
    for path in paths:
        for _, record in records(path):
            yield record


def read_gaps(paths: Iterable[str]) -> dict[tuple[str, object], dict[str, object]]:
    """(request id, suffix stripped; global step) -> that sample's gap line (the last, when ids repeat)."""
    return {
        (strip_vllm_suffix(str(record["request_id"])), record.get("global_step")): record
        for record in gap_lines(paths)
        if record.get("request_id") is not None
    }


def causes(results: Sequence[PairResult], gaps: dict[tuple[str, object], dict[str, object]]) -> list[SampleCause]:
    """One :class:`SampleCause` per sample that has pairs or a gap line, worst gap first."""
    samples: dict[tuple[str, object], SampleCause] = {}
    for r in results:
        sample = samples.setdefault((str(r.key), r.global_step), SampleCause(str(r.key), r.global_step))
        if r.kind is PairKind.DECODE:
            sample.decode.append(r)
        elif sample.prefill is None or r.verdict is Verdict.DIVERGES:
            sample.prefill = r
    for (key, step), line in gaps.items():
        sample = samples.setdefault((key, step), SampleCause(key, step))
        sample.gap = {name: line.get(name) for name in GAP_FIELDS}
    for sample in samples.values():
        sample.decode.sort(key=lambda r: (r.token_index is None, r.token_index))
    by_gap = [(gap, s) for s in samples.values() if isinstance(gap := s.gap.get("max"), (int, float))]
    if len(by_gap) == len(samples):  # every sample has its gap: the largest first
        return [s for _, s in sorted(by_gap, key=lambda pair: -float(pair[0]))]
    return list(samples.values())


def path_verdict(samples: Sequence[SampleCause]) -> str:
    """One sentence: on which path the divergence is, and where it starts ("where: ..."; the report's one "cause:"
    line is the diagnosis's, :mod:`.diagnosis`)."""
    prefill = [s for s in samples if s.path == CausePath.PREFILL]
    decode = [s for s in samples if s.path == CausePath.DECODE]
    compared = [s for s in samples if s.path is not None]
    if not compared:
        return "where: not found (no pair of these samples could be compared)"
    if prefill:
        first = min(prefill, key=lambda s: s.prefill.first_order)
        return (
            f"where: {CausePath.PREFILL}: {first.prefill.first_module} {first.prefill.first_io} diverges at the prompt "
            f"({len(prefill)} of {len(compared)} samples), so every response token inherits it"
        )
    if decode:
        first = min(decode, key=lambda s: s.decode_diverging[0].first_order)
        token = first.decode_diverging[0]
        any_prefill = any(s.prefill is not None for s in compared)
        clean = "the prefill agrees" if any_prefill else "the prefill was not compared"
        return (
            f"where: {CausePath.DECODE}: {token.first_module} {token.first_io} diverges at decode tokens only "
            f"({clean}; first at response token {token.token_index}; {len(decode)} of {len(compared)} samples)"
        )
    where = "at prefill or at the compared decode tokens"
    return f"where: {CausePath.NEITHER}: nothing diverges {where} ({len(compared)} samples)"
