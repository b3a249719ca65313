"""The decode join: a training dump of whole sequences (prompt and response tokens) against the inference rows
each response token was sampled from, and its prompts' rows against a packed full prefill.

Response token ``t`` (``1 <= t < R``; token 0 is the prefill's) was sampled from the output of the inference
row at position ``p = prompt_len - 1 + t``: a decode row with ``computed_tokens == p`` (its input is the
sequence's token ``p``), or the last row of a prefill that ends there (a request recomputed after a
preemption: prompt and the tokens before ``t`` in one step). It meets row ``offset + p`` of the dumped
forward. A row at the sequence's last position feeds no response token (SGLang runs one decode step past
the last one): not paired. Joined by request id only (the same prompt recurs under other ids). Statistics
dumps pair too: compare says they cannot be cut per token.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from msprobe_hooks.analysis.pairing.candidates import Candidate, generate_dump, train_dump
from msprobe_hooks.analysis.pairing.join import Join
from msprobe_hooks.analysis.pairing.logs import GenerateRow, GenerateStep, TrainDump, TrainSample
from msprobe_hooks.analysis.pairing.pairs import JoinRule, Pair, PairKind
from msprobe_hooks.analysis.results import Unpaired
from msprobe_hooks.join_keys import PROMPT_WINDOW


@dataclass(frozen=True)
class _Response:
    """A sample of the dump that holds response tokens: its prompt length and last position known."""

    sample: TrainSample
    prompt_len: int
    last: int  # its last token's position: no response token is sampled from its row


@dataclass(frozen=True)
class _Placed(Candidate):
    """A candidate whose row's place in its sequence is known (:attr:`Candidate.position`)."""

    place: int


def _responses(dump: TrainDump) -> list[_Response]:
    if dump.kind == PROMPT_WINDOW:  # it lists its sample whole (seq_len counts the response), but holds its prompt
        return []
    return [
        _Response(m, m.prompt_len, m.seq_len - 1)
        for m in dump.members
        if m.prompt_len is not None and m.seq_len is not None and m.seq_len > m.prompt_len
    ]


class DecodeJoin:
    def __init__(self, join: Join) -> None:
        self.join = join

    def match(self, dump: TrainDump) -> list[Pair] | Unpaired | None:
        """The decode pairs (and prompt pairs) of a training dump holding whole sequences, or why there are
        none; None when the dump holds no response tokens."""
        responses = _responses(dump)
        if not responses:
            return None
        train_path = train_dump(dump)
        if not self.join.probe.readable(train_path):  # the steps only it wanted stay unpaired for that reason
            bases = {base for r in responses if (base := r.sample.request_base) is not None}
            for candidate in (c for base in bases for c in self.join.index.decode_by_base.get(base, [])):
                self.join.ledger.refused[candidate.key] = Unpaired.DUMP_UNREADABLE  # nearest to a pair: over any other
            return Unpaired.DUMP_UNREADABLE
        found: list[Pair] = []
        reasons: Counter[Unpaired] = Counter()
        for response in responses:
            base, offset = response.sample.request_base, response.sample.offset
            if offset is not None and base is not None and base not in self.join.ledger.paired_requests:
                prefill = self._prompt_pair(dump, train_path, response, base, offset)
                if prefill is not None:
                    found.append(prefill)
            found += self._decode_pairs(dump, train_path, response, reasons)
        return found or reasons.most_common(1)[0][0]

    def _prompt_pair(
        self, dump: TrainDump, train_path: str, response: _Response, base: str, offset: int
    ) -> Pair | None:
        """The prefill pair of a sequence's prompt rows (a request no prompt-only dump paired), or None."""
        join = self.join
        good = [
            c
            for c in join.index.by_base.get(base, [])
            if c.row.full and c.step.dumped is not False and join.probe.readable(generate_dump(c.step))
        ]
        ranked = join.rank(good, dump.rank) if good else None
        if not isinstance(ranked, tuple):
            return None
        pool, rank_rule = ranked
        for candidate in sorted(pool, key=lambda c: (c.step.pid or 0, c.step.step)):
            rows = self._rows(candidate.step, candidate.row)
            if rows is None:
                continue
            join.ledger.used.add(candidate.key)
            join.ledger.paired_requests.add(base)
            pair = join.pair(dump, train_path, candidate, JoinRule.REQUEST_ID, base, rank_rule, response.prompt_len)
            pair.train.sample, pair.train.request_id = response.sample.index, response.sample.request_id
            pair.train.rows, pair.generate.rows = [offset, offset + response.prompt_len], list(rows)
            return pair
        return None

    def _decode_pairs(
        self, dump: TrainDump, train_path: str, response: _Response, reasons: Counter[Unpaired]
    ) -> list[Pair]:
        """A pair for each response token of one sequence whose row was dumped; why not counted in ``reasons``."""
        join = self.join
        base, offset = response.sample.request_base, response.sample.offset
        candidates = join.same_round(dump, join.index.decode_by_base.get(base, [])) if base is not None else []
        if base is None or offset is None or not candidates:
            reasons[Unpaired.NO_JOIN_KEY if offset is None else Unpaired.NO_COUNTERPART] += 1
            return []
        placed = [_Placed(c.step, c.row, p) for c in candidates if (p := c.position) is not None]
        inside = [c for c in placed if response.prompt_len <= c.place < response.last]
        join.ledger.past.update(c.key for c in placed if c.place >= response.last)
        ranked = join.rank(inside, dump.rank) if inside else Unpaired.NO_COUNTERPART
        if isinstance(ranked, Unpaired):
            reasons[ranked] += 1
            return []
        pool, rank_rule = ranked
        chosen: dict[int, _Placed] = {}  # one row per position: the first process's, step
        for candidate in sorted(pool, key=lambda c: (c.step.pid or 0, c.step.step)):
            if not join.probe.readable(generate_dump(candidate.step)):
                reasons[Unpaired.DUMP_UNREADABLE] += 1
                continue
            chosen.setdefault(candidate.place, candidate)
        found = []
        for position, candidate in sorted(chosen.items()):
            rows = self._rows(candidate.step, candidate.row)
            if rows is None:
                reasons[Unpaired.MULTI_REQUEST] += 1
                continue
            join.ledger.used.add(candidate.key)
            start = offset + position
            pair = join.pair(dump, train_path, candidate, JoinRule.REQUEST_ID, base, rank_rule, response.prompt_len)
            pair.kind, pair.position, pair.token_index = PairKind.DECODE, position, position - response.prompt_len + 1
            pair.train.sample, pair.train.request_id = response.sample.index, response.sample.request_id
            pair.train.rows, pair.generate.rows = [start, start + 1], [rows[1] - 1, rows[1]]  # the row's last token
            found.append(pair)
        return found

    def _rows(self, step: GenerateStep, row: GenerateRow) -> tuple[int, int] | None:
        """The rows of ``row``'s request in ``step``'s dump (a decode row, or a whole prefill), or None when
        they cannot be told apart.

        The whole step was dumped (its embedding input holds every row: the request's rows are at its
        offset), or msprobe's ``request_id`` filter cut it to this request (its rows are the dump's).
        """
        tokens = row.tokens or 1
        held = self.join.probe.tokens(generate_dump(step))
        if held is not None and held == step.total_tokens and row.offset is not None:
            return row.offset, row.offset + tokens
        if len(step.rows) == 1 or self.join.filtered(step, row):
            return 0, tokens
        return None
