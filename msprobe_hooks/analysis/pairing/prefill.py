"""The prefill join: a training dump of one prompt against the inference dump of that prompt's full prefill.

By request id when both sides carry it, else by prompt hash (ambiguous when it names several requests);
of the steps that prefilled it, one holding that request alone or cut to it by msprobe's ``request_id``
filter, at the rank the training rank pairs with (:meth:`.join.Join.rank`), with its engine's other ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from msprobe_hooks.analysis.pairing.candidates import Candidate, generate_dump, train_dump
from msprobe_hooks.analysis.pairing.join import Join
from msprobe_hooks.analysis.pairing.logs import TrainDump
from msprobe_hooks.analysis.pairing.pairs import JoinRule, Pair, RankRule
from msprobe_hooks.analysis.pairing.ranks import engine_ranks
from msprobe_hooks.analysis.results import Backend, Unpaired

# When several dumps of one request each fail, the reason reported is the one nearest to a pair.
_NEAREST = (Unpaired.DUMP_UNREADABLE, Unpaired.NOT_DUMPED, Unpaired.MULTI_REQUEST, Unpaired.NOT_FULL_PREFILL)


@dataclass(frozen=True)
class _Found:
    """The prefill rows a training dump's key finds (in its rollout round)."""

    rule: JoinRule
    key: str
    candidates: list[Candidate]


def _not_one_prompt(dump: TrainDump) -> Unpaired | None:
    """Why a dump has no prefill pair when it is not of one prompt alone; None when it is."""
    if dump.samples == 0:
        return Unpaired.NO_JOIN_KEY
    if dump.samples > 1:
        return Unpaired.MULTI_REQUEST
    return None if dump.prompt_only else Unpaired.NOT_PROMPT_ONLY


class PrefillJoin:
    def __init__(self, join: Join) -> None:
        self.join = join

    def match(self, dump: TrainDump) -> Pair | Unpaired:
        """The prefill pair of one training dump, or the reason it has none."""
        refusal = _not_one_prompt(dump)
        if refusal is not None:
            return refusal
        train_path = train_dump(dump)
        readable = self.join.probe.readable(train_path)
        found = self._lookup(dump)
        if not readable:  # its counterparts, if any, stay unpaired for the same reason
            for candidate in [] if isinstance(found, Unpaired) else found.candidates:
                self.join.ledger.refused.setdefault(candidate.key, Unpaired.DUMP_UNREADABLE)
            return Unpaired.DUMP_UNREADABLE
        if isinstance(found, Unpaired):
            return found
        if not found.candidates:
            return Unpaired.DECODE_ONLY  # the key is in the logs, in decode rows only
        prompt_len = dump.prompt_len
        if prompt_len is None and any(c.row.full is None for c in found.candidates):
            prompt_len = self.join.probe.tokens(train_path)
        good = self._good(found.candidates, prompt_len)
        if isinstance(good, Unpaired):
            return good
        ranked = self.join.rank(good, dump.rank)
        if isinstance(ranked, Unpaired):
            return ranked
        return self._pair(dump, train_path, found, good, ranked, prompt_len)

    def _lookup(self, dump: TrainDump) -> _Found | Unpaired:
        """The prefill rows of one training sample's key, or why there are none."""
        index, base = self.join.index, dump.request_base
        if base is not None and base in index.seen_bases:
            candidates = index.by_base.get(base, [])
            kept = self.join.same_round(dump, candidates)
            return _Found(JoinRule.REQUEST_ID, base, kept) if kept or not candidates else Unpaired.OTHER_STEP
        if dump.prompt_hash is not None and dump.prompt_hash in index.seen_hashes:
            candidates = index.by_hash.get(dump.prompt_hash, [])
            kept = self.join.same_round(dump, candidates)
            if candidates and not kept:
                return Unpaired.OTHER_STEP
            if index.hash_ambiguous(dump, kept):
                self.join.ledger.refused.update((c.key, Unpaired.AMBIGUOUS_HASH) for c in kept)
                return Unpaired.AMBIGUOUS_HASH
            return _Found(JoinRule.PROMPT_HASH, dump.prompt_hash, kept)
        return Unpaired.NO_JOIN_KEY if base is None and dump.prompt_hash is None else Unpaired.NO_COUNTERPART

    def _good(self, candidates: list[Candidate], prompt_len: int | None) -> list[Candidate] | Unpaired:
        """The candidates that can pair with a training prompt of ``prompt_len`` tokens; the others are
        refused, and when none is left, the reason nearest to a pair."""
        good: list[Candidate] = []
        failed: set[Unpaired] = set()
        for candidate in candidates:
            verdict = self._verdict(candidate, prompt_len)
            if verdict is None:
                good.append(candidate)
            else:
                failed.add(verdict)
                self.join.ledger.refused.setdefault(candidate.key, verdict)
        return good or next(reason for reason in _NEAREST if reason in failed)

    def _verdict(self, candidate: Candidate, prompt_len: int | None) -> Unpaired | None:
        """None if ``candidate`` can be paired with a training prompt of ``prompt_len`` tokens, else why not."""
        step, row = candidate.step, candidate.row
        if step.dumped is False:
            return Unpaired.NOT_DUMPED
        if row.full is False:
            return Unpaired.NOT_FULL_PREFILL
        path = generate_dump(step)
        if not self.join.probe.readable(path):
            return Unpaired.DUMP_UNREADABLE
        single = len(step.rows) == 1
        if row.full is None:  # the recipe's log: full when it holds exactly the training prompt
            held = self.join.probe.tokens(path) if single else row.tokens
            if prompt_len is None or held != prompt_len:
                return Unpaired.NOT_FULL_PREFILL
        if not single and not self.join.filtered(step, row):
            return Unpaired.MULTI_REQUEST
        return None

    def _pair(
        self,
        dump: TrainDump,
        train_path: str,
        found: _Found,
        good: list[Candidate],
        ranked: tuple[list[Candidate], RankRule],
        prompt_len: int | None,
    ) -> Pair:
        """The pair with the chosen prefill among ``ranked``'s: one holding this request alone first, then the
        earliest; with FSDP, against every rank of its engine."""
        pool, rank_rule = ranked
        chosen = min(pool, key=lambda c: (len(c.step.rows) > 1, c.step.pid or 0, c.step.step))
        group = self._engine_ranks(chosen, good, found.key)
        if len(group) > 1 and self.join.backend == "fsdp":  # whole training tensors: against every rank, made whole
            chosen, rank_rule = group[0], RankRule.ALL_RANKS
        ledger = self.join.ledger
        ledger.used.update(c.key for c in group)
        ledger.paired_requests.add(chosen.row.base or found.key)
        if prompt_len is None:
            prompt_len = chosen.row.prompt_len if chosen.row.prompt_len is not None else chosen.row.tokens
        pair = self.join.pair(dump, train_path, chosen, found.rule, found.key, rank_rule, prompt_len)
        if self.join.backend == Backend.MEGATRON and prompt_len is not None:
            held = self.join.probe.tokens(train_path)
            if held is not None and held > prompt_len:  # Megatron pads each sequence to a multiple of TP x CP
                pair.train.rows = [0, prompt_len]
        if len(group) > 1:
            pair.generate.shards = [self.join.shard(c) for c in group]
        return pair

    def _engine_ranks(self, chosen: Candidate, good: list[Candidate], key: str) -> list[Candidate]:
        """``chosen`` and the same prefill's dumps on the other ranks of its engine (tensor parallel)."""
        group = engine_ranks(chosen, good)
        if group is None:
            self.join.warn(
                f"{key}: its prefill at step {chosen.step.step} was dumped twice on one rank (two replicas at the "
                "same step?): the engine's tensor-parallel ranks cannot be told apart; paired with one rank only"
            )
            return [chosen]
        return group
