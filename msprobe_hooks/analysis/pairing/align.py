"""Pairing training dumps with inference dumps (``msprobe-hooks align``; docs/analysis.md).

Pairs each training prompt-only dump with the inference dump of that prompt's full prefill:

* the join: by request id (the engine's suffix stripped) when both sides carry it, else by the
  prompt-token hash; equal prompts under different ids, or several requests with one prompt,
  are ambiguous and never paired;
* the inference step: one holding that request alone, or a packed step that msprobe's
  ``request_id`` filter cut to it (its dumped token count is that request's, or the generate
  config names it); other packed steps are reported, not paired;
* the rank: the generate rank equal to the training rank (the recipe's rule; Megatron needs it,
  TP/PP/EP being equal); with FSDP, whose training ranks hold whole activations, the lowest rank
  that dumped the prefill when no equal rank did (generate TP smaller than the number of cards).

A training dump of whole sequences (``DUMP_SEQUENCES=1``, or a micro-batch with its samples' offsets)
gives decode pairs too: each response token after the first against the inference row it was sampled
from (a decode row, or the last row of a recompute after a preemption), wherever a packed step put that
row; and its prompt's rows against a packed full prefill.

What is not paired is counted by reason, per side.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from msprobe_hooks.analysis import layout
from msprobe_hooks.analysis.dumpfile import DumpFileError, check_readable, embedding_tokens
from msprobe_hooks.analysis.pairing.logs import (
    DecodeStep,
    GenRow,
    GenStep,
    TrainDump,
    TrainSample,
    read_dispatch,
    read_training,
)
from msprobe_hooks.analysis.pairing.pairs import (
    LOG_FORMATS,
    GenerateSide,
    JoinRule,
    Pair,
    PairKind,
    RankRule,
    Shard,
    TrainSide,
)
from msprobe_hooks.analysis.pairing.ranks import engine_ranks
from msprobe_hooks.analysis.results import Unpaired
from msprobe_hooks.join_keys import PROMPT_WINDOW
from msprobe_hooks.log import logger

BACKENDS = ("fsdp", "megatron")
# When several dumps of one request each fail, the reason reported is the one nearest to a pair.
_NEAREST = (Unpaired.DUMP_UNREADABLE, Unpaired.NOT_DUMPED, Unpaired.MULTI_REQUEST, Unpaired.NOT_FULL_PREFILL)


@dataclass(frozen=True)
class _Candidate:
    step: GenStep
    row: GenRow

    @property
    def key(self) -> tuple[str, int]:
        return (self.step.log, self.step.line)

    @property
    def position(self) -> int | None:
        """The place in its sequence of the row's last token, whose output the engine samples from; None unknown.

        A decode row's one token; a prefill row's last (a recompute after a preemption: prompt and the
        tokens generated before it, the next token sampled from its last row).
        """
        row = self.row
        return None if row.computed is None else row.computed + (row.tokens or 1) - 1


@dataclass
class Result:
    """What one ``align`` run found."""

    pairs: list[Pair] = field(default_factory=list)
    train_total: int = 0
    generate_total: int = 0
    train_unpaired: Counter = field(default_factory=Counter)
    generate_unpaired: Counter = field(default_factory=Counter)
    problems: int = 0  # bad log lines and unreadable dumps, each reported on stderr


class Aligner:
    """One join of training logs with dispatch logs; ``out_dir`` is the pairs file's folder."""

    def __init__(
        self,
        out_dir: str,
        backend: str = "fsdp",
        config_request_ids: frozenset[str] = frozenset(),
    ) -> None:
        self.out_dir = os.path.abspath(out_dir)
        self.backend = backend
        self.config_request_ids = config_request_ids
        self.result = Result()
        self._trains: list[TrainDump] = []
        self._prefill_steps: list[GenStep] = []
        self._decode_steps: list[GenStep] = []  # dumped steps without prefill rows
        self._decode_by_base: dict[str, list[_Candidate]] = {}
        self._by_base: dict[str, list[_Candidate]] = {}
        self._by_hash: dict[str, list[_Candidate]] = {}
        self._seen_bases: set[str] = set()
        self._seen_hashes: set[str] = set()
        self._train_identities: dict[tuple[str, Any], set[Any]] = {}  # (prompt hash, global step) -> samples
        self._step_times: dict[Any, tuple[float, float]] = {}  # global step -> its first and last log time
        self._tokens: dict[str, int | None] = {}
        self._gap_logs_of: dict[str, list[str] | None] = {}  # training root -> its gap logs, as pairs name them
        self._routed_of: dict[str, str | None] = {}  # inference process folder -> its routed-experts log, if any
        self._unreadable: set[str] = set()
        self._readable: set[str] = set()
        self._used: set[tuple[str, int]] = set()
        # Why a generate dump did not pair with the training dump that wanted it.
        self._refused: dict[tuple[str, int], Unpaired] = {}
        self._paired_requests: set[str] = set()
        self._past: set[tuple[str, int]] = set()  # dumped steps with a row past a sequence's last response token
        # Every request id the training logs name (None: a recipe line of several samples names them not per sample).
        self._train_bases: set[str] | None = set()

    # --- reading -------------------------------------------------------------------------------

    def warn(self, message: str) -> None:
        self.result.problems += 1
        logger().warning("align: %s", message)

    def read(self, train_logs: list[str], dispatch_logs: list[str]) -> None:
        for path in train_logs:
            for dump in read_training(path, self.warn):
                self._trains.append(dump)
                self._note_bases(dump)
                if dump.prompt_hash is not None:
                    self._train_identities.setdefault((dump.prompt_hash, dump.global_step), set()).add(dump.identity)
                if dump.time is not None and dump.global_step is not None:
                    first, last = self._step_times.get(dump.global_step, (dump.time, dump.time))
                    self._step_times[dump.global_step] = (min(first, dump.time), max(last, dump.time))
        for path in dispatch_logs:
            for step in read_dispatch(path, self.warn):
                self._index(step)

    def _note_bases(self, dump: TrainDump) -> None:
        if dump.recipe and dump.samples > 1:
            self._train_bases = None
        if self._train_bases is not None:
            self._train_bases.update(b for b in (dump.request_base, *(m.request_base for m in dump.members)) if b)

    def _index(self, step: GenStep | DecodeStep) -> None:
        if isinstance(step, DecodeStep):
            self._seen_bases.update(step.bases)
            self._seen_hashes.update(step.hashes)
            return
        if step.dumped is not False:  # its rows that sample a response token may pair with a training sequence
            for row in step.rows:
                candidate = _Candidate(step, row)
                after_prompt = row.prompt_len is not None and (candidate.position or 0) >= row.prompt_len
                if row.base is not None and (not row.prefill or after_prompt):
                    self._decode_by_base.setdefault(row.base, []).append(candidate)
        if not any(row.prefill for row in step.rows):  # a dumped decode step
            self._decode_steps.append(step)
            self._seen_bases.update(row.base for row in step.rows if row.base is not None)
            return
        self._prefill_steps.append(step)
        for row in step.rows:
            if row.base is not None:
                self._seen_bases.add(row.base)
            if row.prompt_hash is not None:
                self._seen_hashes.add(row.prompt_hash)
            if not row.prefill:
                continue
            candidate = _Candidate(step, row)
            if row.base is not None:
                self._by_base.setdefault(row.base, []).append(candidate)
            if row.prompt_hash is not None:
                self._by_hash.setdefault(row.prompt_hash, []).append(candidate)

    # --- dumps ---------------------------------------------------------------------------------

    def _train_dump(self, dump: TrainDump) -> str:
        return layout.training_dump(dump.log, dump.step, dump.rank, dump.pid)

    def _generate_dump(self, step: GenStep) -> str:
        return layout.generate_dump(step.log, step.step, step.rank, step.pid)

    def _gap_logs(self, log: str) -> list[str] | None:
        """The gap logs of a training log's root, as the pairs file names them; None when there are none."""
        root = layout.log_root(log)
        if root not in self._gap_logs_of:
            self._gap_logs_of[root] = [self._path(gap) for gap in layout.gap_logs(root)] or None
        return self._gap_logs_of[root]

    def _routed_experts_log(self, log: str) -> str | None:
        """The routed-experts log beside a dispatch log, as the pairs file names it; None when not written."""
        process = layout.process_folder(log)
        if process not in self._routed_of:
            found = layout.routed_experts_log(process)
            self._routed_of[process] = self._path(found) if os.path.isfile(found) else None
        return self._routed_of[process]

    def _is_readable(self, path: str) -> bool:
        if path in self._readable:
            return True
        if path in self._unreadable:
            return False
        try:
            check_readable(path)
        except DumpFileError as exc:
            self._unreadable.add(path)
            self.warn(str(exc))
            return False
        self._readable.add(path)
        return True

    def _token_count(self, path: str) -> int | None:
        """The dump's embedding token count; None when unknown (no embedding entry, unreadable)."""
        if path not in self._tokens:
            try:
                self._tokens[path] = embedding_tokens(path)
            except DumpFileError as exc:
                self._tokens[path] = None
                if path not in self._unreadable:
                    self._unreadable.add(path)
                    self.warn(str(exc))
        return self._tokens[path]

    # --- the generate side of one candidate ---------------------------------------------------

    def _filtered(self, step: GenStep, row: GenRow) -> bool:
        """A packed step whose dump msprobe's ``request_id`` filter cut to ``row``'s request."""
        if self.config_request_ids & {row.request_id, row.base}:
            return True
        if row.tokens is None or sum(1 for r in step.rows if r.tokens == row.tokens) > 1:
            return False  # the dumped count could be any of several rows'
        return self._token_count(self._generate_dump(step)) == row.tokens

    def _verdict(self, candidate: _Candidate, prompt_len: int | None) -> Unpaired | None:
        """None if ``candidate`` can be paired with a training prompt of ``prompt_len`` tokens, else why not."""
        step, row = candidate.step, candidate.row
        if step.dumped is False:
            return Unpaired.NOT_DUMPED
        if row.full is False:
            return Unpaired.NOT_FULL_PREFILL
        path = self._generate_dump(step)
        if not self._is_readable(path):
            return Unpaired.DUMP_UNREADABLE
        single = len(step.rows) == 1
        if row.full is None:  # the recipe's log: full when it holds exactly the training prompt
            held = self._token_count(path) if single else row.tokens
            if prompt_len is None or held != prompt_len:
                return Unpaired.NOT_FULL_PREFILL
        if not single and not self._filtered(step, row):
            return Unpaired.MULTI_REQUEST
        return None

    # --- the join ------------------------------------------------------------------------------

    def _rollout_round(self, step: GenStep) -> Any:
        """The global step whose rollout an inference step belongs to, by the logs' times; None if unknown.

        RL runs each global step as rollout, then training: an inference step at time ``s`` belongs to the
        first global step g whose training lines all come after ``s``, provided every line of the global
        step before it came before ``s`` and that step is g - 1 (with a step missing from the logs, the
        rollout before g may be the missing one's). One inside a training step's span (an asynchronous
        trainer), or without a time, has no round.
        """
        if step.time is None:
            return None
        previous: tuple[Any, float] | None = None  # the global step before, and its last line's time
        for global_step, (first, last) in sorted(self._step_times.items(), key=lambda item: item[1]):
            if first > step.time:
                if previous is None:
                    return global_step
                after_previous = previous[1] < step.time
                return global_step if after_previous and _consecutive(previous[0], global_step) else None
            previous = (global_step, last)
        return None

    def _same_round(self, dump: TrainDump, candidates: list[_Candidate]) -> list[_Candidate]:
        """The candidates of the rollout that produced ``dump``'s sample; the others are refused.

        Only in a run of several global steps with times on both sides (older logs: every candidate).
        A prompt comes back every epoch: without this a prompt-hash join could pair global step 3's
        training forward with step 1's rollout.
        """
        if len(self._step_times) < 2 or dump.global_step not in self._step_times:
            return candidates
        kept = [c for c in candidates if self._rollout_round(c.step) == dump.global_step]
        self._refused.update((c.key, Unpaired.OTHER_STEP) for c in candidates if c not in kept)
        return kept

    def _hash_ambiguous(self, dump: TrainDump, candidates: list[_Candidate]) -> bool:
        """Whether the prompt hash points at more than one request, on either side (within a global step)."""
        if len(self._train_identities.get((dump.prompt_hash, dump.global_step), ())) > 1:
            return True
        ids = {c.row.base for c in candidates if c.row.base is not None}
        if ids and (dump.request_base is not None or len(ids) > 1):
            return True  # ids on the inference side that the training side does not share
        per_rank = Counter(c.step.rank for c in candidates)  # id-less rows: one per request and rank
        return not ids and any(n > 1 for n in per_rank.values())

    def _lookup(self, dump: TrainDump) -> tuple[JoinRule, str, list[_Candidate]] | Unpaired:
        """(rule, key, the prefill rows of that key) for one training sample, or why there are none."""
        base = dump.request_base
        if base is not None and base in self._seen_bases:
            candidates = self._by_base.get(base, [])
            kept = self._same_round(dump, candidates)
            return (JoinRule.REQUEST_ID, base, kept) if kept or not candidates else Unpaired.OTHER_STEP
        if dump.prompt_hash is not None and dump.prompt_hash in self._seen_hashes:
            candidates = self._by_hash.get(dump.prompt_hash, [])
            kept = self._same_round(dump, candidates)
            if candidates and not kept:
                return Unpaired.OTHER_STEP
            candidates = kept
            if self._hash_ambiguous(dump, candidates):
                self._refused.update((c.key, Unpaired.AMBIGUOUS_HASH) for c in candidates)
                return Unpaired.AMBIGUOUS_HASH
            return JoinRule.PROMPT_HASH, dump.prompt_hash, candidates
        return Unpaired.NO_JOIN_KEY if base is None and dump.prompt_hash is None else Unpaired.NO_COUNTERPART

    def match(self, dump: TrainDump) -> Pair | Unpaired:
        """The pair of one training dump, or the reason it has none."""
        if dump.samples == 0:
            return Unpaired.NO_JOIN_KEY
        if dump.samples > 1:
            return Unpaired.MULTI_REQUEST
        if not dump.prompt_only:
            return Unpaired.NOT_PROMPT_ONLY
        train_path = self._train_dump(dump)
        readable = self._is_readable(train_path)
        found = self._lookup(dump)
        if not readable:  # its counterparts, if any, stay unpaired for the same reason
            if not isinstance(found, Unpaired):
                for candidate in found[2]:
                    self._refused.setdefault(candidate.key, Unpaired.DUMP_UNREADABLE)
            return Unpaired.DUMP_UNREADABLE
        if isinstance(found, Unpaired):
            return found
        rule, key, candidates = found
        if not candidates:
            return Unpaired.DECODE_ONLY  # the key is in the logs, in decode rows only
        prompt_len = dump.prompt_len
        if prompt_len is None and any(c.row.full is None for c in candidates):
            prompt_len = self._token_count(train_path)
        good, failed = [], set()
        for candidate in candidates:
            verdict = self._verdict(candidate, prompt_len)
            if verdict is None:
                good.append(candidate)
            else:
                failed.add(verdict)
                self._refused.setdefault(candidate.key, verdict)
        if not good:
            return next(reason for reason in _NEAREST if reason in failed)
        ranked = self._rank(good, dump.rank)
        if isinstance(ranked, Unpaired):
            return ranked
        pool, rank_rule = ranked
        # A step holding this request alone first, then the earliest.
        chosen = min(pool, key=lambda c: (len(c.step.rows) > 1, c.step.pid or 0, c.step.step))
        group = self._engine_ranks(chosen, good, key)
        if len(group) > 1 and self.backend == "fsdp":  # whole training tensors: against every rank, made whole
            chosen, rank_rule = group[0], RankRule.ALL_RANKS
        self._used.update(c.key for c in group)
        self._paired_requests.add(chosen.row.base or key)
        if prompt_len is None:
            prompt_len = chosen.row.prompt_len if chosen.row.prompt_len is not None else chosen.row.tokens
        pair = self._pair(dump, train_path, chosen, rule, key, rank_rule, prompt_len)
        if self.backend == "megatron" and prompt_len is not None:
            held = self._token_count(train_path)
            if held is not None and held > prompt_len:  # Megatron pads each sequence to a multiple of TP x CP
                pair.train.rows = [0, prompt_len]
        if len(group) > 1:
            pair.generate.shards = [self._shard(c) for c in group]
        return pair

    def _engine_ranks(self, chosen: _Candidate, good: list[_Candidate], key: str) -> list[_Candidate]:
        """``chosen`` and the same prefill's dumps on the other ranks of its engine (tensor parallel)."""
        group = engine_ranks(chosen, good)
        if group is None:
            self.warn(
                f"{key}: its prefill at step {chosen.step.step} was dumped twice on one rank (two replicas at the "
                "same step?): the engine's tensor-parallel ranks cannot be told apart; paired with one rank only"
            )
            return [chosen]
        return group

    def _shard(self, candidate: _Candidate) -> Shard:
        return Shard(dump=self._path(self._generate_dump(candidate.step)), **self._whence(candidate.step))

    def _whence(self, entry: TrainDump | GenStep) -> dict[str, Any]:
        """Where a side of a pair was logged: its msprobe step, rank, process, log file and line."""
        return {
            "step": entry.step,
            "rank": entry.rank,
            "pid": entry.pid,
            "log": self._path(entry.log),
            "line": entry.line,
        }

    def _rank(self, good: list[_Candidate], rank: int | None) -> tuple[list[_Candidate], RankRule] | Unpaired:
        """The candidates at the rank a training dump of ``rank`` pairs with, and the rule that chose it."""
        same = [c for c in good if c.step.rank == rank]
        if same:
            return same, RankRule.SAME
        if self.backend == "fsdp":
            lowest = min(-1 if c.step.rank is None else c.step.rank for c in good)
            return [c for c in good if (-1 if c.step.rank is None else c.step.rank) == lowest], RankRule.FSDP_ANY
        self._refused.update((c.key, Unpaired.OTHER_RANKS_ONLY) for c in good)
        return Unpaired.OTHER_RANKS_ONLY

    # --- decode pairs: one response token of a training sequence against its decode step -------------

    def _decode_rows(self, step: GenStep, row: GenRow) -> tuple[int, int] | None:
        """The rows of ``row``'s request in ``step``'s dump (a decode row, or a whole prefill), or None when
        they cannot be told apart.

        The whole step was dumped (its embedding input holds every row: the request's rows are at its
        offset), or msprobe's ``request_id`` filter cut it to this request (its rows are the dump's).
        """
        tokens = row.tokens or 1
        held = self._token_count(self._generate_dump(step))
        if held is not None and held == step.total_tokens and row.offset is not None:
            return row.offset, row.offset + tokens
        if len(step.rows) == 1 or self._filtered(step, row):
            return 0, tokens
        return None

    def _prefill_rows(self, dump: TrainDump, train_path: str, member: TrainSample) -> Pair | None:
        """The prefill pair of a sequence's prompt rows (a request no prompt-only dump paired), or None."""
        good = [
            c
            for c in self._by_base.get(member.request_base, [])
            if c.row.full and c.step.dumped is not False and self._is_readable(self._generate_dump(c.step))
        ]
        ranked = self._rank(good, dump.rank) if good else None
        if not isinstance(ranked, tuple):
            return None
        pool, rank_rule = ranked
        for candidate in sorted(pool, key=lambda c: (c.step.pid or 0, c.step.step)):
            rows = self._decode_rows(candidate.step, candidate.row)
            if rows is None:
                continue
            self._used.add(candidate.key)
            self._paired_requests.add(member.request_base)  # type: ignore[arg-type]
            pair = self._pair(
                dump, train_path, candidate, JoinRule.REQUEST_ID, member.request_base, rank_rule, member.prompt_len
            )  # type: ignore[arg-type]
            pair.train.sample, pair.train.request_id = member.index, member.request_id
            pair.train.rows, pair.generate.rows = [member.offset, member.offset + member.prompt_len], list(rows)  # type: ignore[operator]
            return pair
        return None

    def match_sequence(self, dump: TrainDump) -> list[Pair] | Unpaired | None:
        """Decode pairs of a training dump holding whole sequences (prompt and response tokens).

        Response token ``t`` (``1 <= t < R``; token 0 is the prefill's) was sampled from the output of the
        inference row at position ``p = prompt_len - 1 + t``: a decode row with ``computed_tokens == p``
        (its input is the sequence's token ``p``), or the last row of a prefill that ends there (a request
        recomputed after a preemption: prompt and the tokens before ``t`` in one step). It meets row
        ``offset + p`` of the dumped forward. A row at the sequence's last position feeds no response
        token (SGLang runs one decode step past the last one): not paired. Joined by request id only
        (the same prompt recurs under other ids). Statistics dumps pair too: compare says they cannot
        be cut per token. None when the dump holds no response tokens.
        """
        # A prompt window lists its sample whole (seq_len counts the response), but holds its prompt only.
        members = [m for m in dump.members if m.has_response] if dump.kind != PROMPT_WINDOW else []
        if not members:
            return None
        train_path = self._train_dump(dump)
        if not self._is_readable(train_path):  # the steps only it wanted stay unpaired for that reason
            for member in members:
                for candidate in self._decode_by_base.get(member.request_base, []):  # type: ignore[arg-type]
                    self._refused[candidate.key] = Unpaired.DUMP_UNREADABLE  # nearest to a pair: over any other
            return Unpaired.DUMP_UNREADABLE
        found: list[Pair] = []
        reasons: Counter = Counter()
        for member in members:
            base = member.request_base
            if member.offset is not None and base is not None and base not in self._paired_requests:
                prefill = self._prefill_rows(dump, train_path, member)
                if prefill is not None:
                    found.append(prefill)
            candidates = self._same_round(dump, self._decode_by_base.get(base, [])) if base is not None else []
            if member.offset is None or not candidates:
                reasons[Unpaired.NO_JOIN_KEY if member.offset is None else Unpaired.NO_COUNTERPART] += 1
                continue
            last = member.seq_len - 1  # type: ignore[operator]
            placed = [c for c in candidates if c.position is not None]
            inside = [c for c in placed if member.prompt_len <= c.position < last]  # type: ignore[operator]
            self._past.update(c.key for c in placed if c.position >= last)  # type: ignore[operator]
            ranked = self._rank(inside, dump.rank) if inside else Unpaired.NO_COUNTERPART
            if isinstance(ranked, Unpaired):
                reasons[ranked] += 1
                continue
            pool, rank_rule = ranked
            chosen: dict[int, _Candidate] = {}  # one row per position: the first process's, step
            for candidate in sorted(pool, key=lambda c: (c.step.pid or 0, c.step.step)):
                if not self._is_readable(self._generate_dump(candidate.step)):
                    reasons[Unpaired.DUMP_UNREADABLE] += 1
                    continue
                chosen.setdefault(candidate.position, candidate)  # type: ignore[arg-type]
            for position, candidate in sorted(chosen.items()):
                rows = self._decode_rows(candidate.step, candidate.row)
                if rows is None:
                    reasons[Unpaired.MULTI_REQUEST] += 1
                    continue
                self._used.add(candidate.key)
                start = member.offset + position
                pair = self._pair(dump, train_path, candidate, JoinRule.REQUEST_ID, base, rank_rule, member.prompt_len)
                pair.kind, pair.position, pair.token_index = PairKind.DECODE, position, position - member.prompt_len + 1
                pair.train.sample, pair.train.request_id = member.index, member.request_id
                pair.train.rows, pair.generate.rows = [start, start + 1], [rows[1] - 1, rows[1]]  # the row's last token
                found.append(pair)
        return found or next(iter(reasons.most_common(1)))[0]

    def _path(self, path: str) -> str:
        """Relative to the pairs file's folder when under it (moves with it), else absolute."""
        path = os.path.abspath(path)
        if os.path.commonpath([path, self.out_dir]) == self.out_dir:
            return os.path.relpath(path, self.out_dir)
        return path

    def _pair(
        self,
        dump: TrainDump,
        train_path: str,
        chosen: _Candidate,
        rule: JoinRule,
        key: str,
        rank_rule: RankRule,
        prompt_len: int | None,
    ) -> Pair:
        step, row = chosen.step, chosen.row
        return Pair(
            pair=len(self.result.pairs),
            rule=rule,
            key=key,
            prompt_len=prompt_len,
            rank_rule=rank_rule,
            train=TrainSide(
                dump=self._path(train_path),
                **self._whence(dump),
                global_step=dump.global_step,
                micro_batch=dump.micro_batch,
                sample=dump.index,
                uid=dump.uid,
                request_id=dump.request_id,
                format=LOG_FORMATS[dump.recipe],
                layer_offset=dump.layer_offset,
                gap_logs=self._gap_logs(dump.log),
            ),
            generate=GenerateSide(
                dump=self._path(self._generate_dump(step)),
                **self._whence(step),
                engine=step.engine,
                request_id=row.request_id,
                filtered=len(step.rows) > 1,
                num_requests=len(step.rows),
                offset=row.offset,
                tokens=row.tokens,
                format=LOG_FORMATS[step.recipe],
                routed_experts_log=self._routed_experts_log(step.log),
            ),
        )

    def _decode_reason(self, step: GenStep) -> Unpaired:
        """Why a dumped decode step is in no pair."""
        refused = self._refused.get((step.log, step.line))
        if refused is not None:
            return refused
        if self._generate_dump(step) in self._unreadable:
            return Unpaired.DUMP_UNREADABLE
        if (step.log, step.line) in self._past:
            return Unpaired.PAST_RESPONSE
        bases = {row.base for row in step.rows if row.base is not None}
        if bases and self._train_bases is not None and not bases & self._train_bases:
            return Unpaired.NO_COUNTERPART
        return Unpaired.DECODE_ONLY

    def _generate_reason(self, step: GenStep) -> str:
        refused = self._refused.get((step.log, step.line))
        if refused is not None:
            return refused
        if self._generate_dump(step) in self._unreadable:
            return Unpaired.DUMP_UNREADABLE
        fulls = [row for row in step.rows if row.full is not False]
        if not fulls:
            return Unpaired.NOT_FULL_PREFILL
        if len(step.rows) > 1 and not any(self._filtered(step, row) for row in fulls):
            return Unpaired.MULTI_REQUEST
        if any((row.base or row.prompt_hash) in self._paired_requests for row in fulls):
            return Unpaired.REPLICA
        return Unpaired.NO_COUNTERPART

    def run(self) -> Result:
        result = self.result
        for dump in self._trains:
            result.train_total += 1
            outcome = self.match(dump)
            if outcome in (Unpaired.NOT_PROMPT_ONLY, Unpaired.MULTI_REQUEST):
                outcome = self.match_sequence(dump) or outcome
            if isinstance(outcome, Unpaired):
                result.train_unpaired[outcome] += 1
                continue
            for pair in outcome if isinstance(outcome, list) else [outcome]:
                pair.pair = len(result.pairs)
                result.pairs.append(pair)
        for step in self._decode_steps:
            result.generate_total += 1
            if (step.log, step.line) not in self._used:
                result.generate_unpaired[self._decode_reason(step)] += 1
        for step in self._prefill_steps:
            if step.dumped is False:
                continue
            result.generate_total += 1
            if (step.log, step.line) not in self._used:
                result.generate_unpaired[self._generate_reason(step)] += 1
        return result


def _consecutive(before: Any, after: Any) -> bool:
    """Whether global step ``after`` directly follows ``before`` (steps that are not numbers: taken as such)."""
    if isinstance(before, int) and isinstance(after, int):
        return after == before + 1
    return True


def config_request_ids(path: str) -> frozenset[str]:
    """The request ids of an msprobe config's ``request_id`` filter (its task section); ValueError if unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except OSError as exc:
        raise ValueError(f"--generate-config {path}: cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--generate-config {path}: not JSON ({exc.msg}); expected an msprobe config.json") from None
    section = config.get(config.get("task", "statistics")) if isinstance(config, dict) else None
    value = section.get("request_id") if isinstance(section, dict) else None
    if value is None:
        return frozenset()
    return frozenset(str(v) for v in (value if isinstance(value, list) else [value]))
