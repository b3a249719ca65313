"""The candidate index: what ``align`` read of both logs, each inference row that may pair found by its key.

Prefill rows by request id and by prompt hash; rows that sample a response token (decode rows, a recompute's
prefill) by request id; every key either log names; the training dumps and the global steps' times, by which
an inference step belongs to a rollout round. Where each line's ``dump.json`` is, and which of them two processes
wrote.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from msprobe_hooks.analysis import layout
from msprobe_hooks.analysis.pairing.logs import (
    DecodeStep,
    GenerateRow,
    GenerateStep,
    TrainDump,
    Warn,
    read_dispatch,
    read_training,
)

LineKey = tuple[str, int]  # a log line: (its file, its number)


def line_key(step: GenerateStep) -> LineKey:
    return (step.log, step.line)


def train_dump(dump: TrainDump) -> str:
    """A training line's dump (:func:`.layout.training_dump`)."""
    return layout.training_dump(dump.log, dump.step, dump.rank, dump.pid)


def generate_dump(step: GenerateStep) -> str:
    """An inference step's dump, next to its dispatch log (:func:`.layout.generate_dump`)."""
    return layout.generate_dump(step.log, step.step, step.rank, step.pid)


@dataclass(frozen=True)
class Candidate:
    """One row of a logged inference step: a request's share of it that may pair."""

    step: GenerateStep
    row: GenerateRow

    @property
    def key(self) -> LineKey:
        return line_key(self.step)

    @property
    def position(self) -> int | None:
        """The place in its sequence of the row's last token, whose output the engine samples from; None unknown.

        A decode row's one token; a prefill row's last (a recompute after a preemption: prompt and the
        tokens generated before it, the next token sampled from its last row).
        """
        row = self.row
        return None if row.computed is None else row.computed + (row.tokens or 1) - 1


class Rounds:
    """The global steps' spans in the training log (first and last line time): which rollout an inference
    step belongs to."""

    def __init__(self) -> None:
        self._spans: dict[Any, tuple[float, float]] = {}

    def note(self, dump: TrainDump) -> None:
        if dump.time is not None and dump.global_step is not None:
            first, last = self._spans.get(dump.global_step, (dump.time, dump.time))
            self._spans[dump.global_step] = (min(first, dump.time), max(last, dump.time))

    def tell(self, global_step: Any) -> bool:
        """Whether the rounds can be told for a training dump of ``global_step``: a run of several global steps
        with times (older logs: never)."""
        return len(self._spans) >= 2 and global_step in self._spans

    def of(self, step: GenerateStep) -> Any:
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
        for global_step, (first, last) in sorted(self._spans.items(), key=lambda item: item[1]):
            if first > step.time:
                if previous is None:
                    return global_step
                after_previous = previous[1] < step.time
                return global_step if after_previous and _consecutive(previous[0], global_step) else None
            previous = (global_step, last)
        return None


def _consecutive(before: Any, after: Any) -> bool:
    """Whether global step ``after`` directly follows ``before`` (steps that are not numbers: taken as such)."""
    if isinstance(before, int) and isinstance(after, int):
        return after == before + 1
    return True


@dataclass
class CandidateIndex:
    """Both logs as ``align`` joins them (:meth:`read`)."""

    trains: list[TrainDump] = field(default_factory=list)
    steps: list[GenerateStep] = field(default_factory=list)  # read whole: with a prefill row, or dumped decode steps
    by_base: dict[str, list[Candidate]] = field(default_factory=dict)  # full-prefill candidates, by request id
    by_hash: dict[str, list[Candidate]] = field(default_factory=dict)  # and by prompt hash
    decode_by_base: dict[str, list[Candidate]] = field(default_factory=dict)  # rows sampling a response token
    seen_bases: set[str] = field(default_factory=set)  # every request id and prompt hash the dispatch logs name
    seen_hashes: set[str] = field(default_factory=set)
    # Every request id the training logs name (None: a recipe line of several samples names them not per sample).
    train_bases: set[str] | None = field(default_factory=set)
    rounds: Rounds = field(default_factory=Rounds)
    _train_identities: dict[tuple[str, Any], set[Any]] = field(default_factory=dict)  # (hash, global step) -> samples
    overwritten: set[str] = field(default_factory=set)  # training dumps two processes' logs name (never paired)

    @classmethod
    def read(cls, train_logs: list[str], dispatch_logs: list[str], warn: Warn) -> CandidateIndex:
        index = cls()
        for path in train_logs:
            for dump in read_training(path, warn):
                index._add_train(dump)
        index._find_shared_folders(warn)
        index._find_unlisted_folders({layout.log_root(path) for path in train_logs}, warn)
        for path in dispatch_logs:
            for step in read_dispatch(path, warn):
                index._add_step(step)
        return index

    def _add_train(self, dump: TrainDump) -> None:
        self.trains.append(dump)
        if dump.recipe and dump.samples > 1:
            self.train_bases = None
        if self.train_bases is not None:
            self.train_bases.update(b for b in (dump.request_base, *(m.request_base for m in dump.members)) if b)
        if dump.prompt_hash is not None:
            self._train_identities.setdefault((dump.prompt_hash, dump.global_step), set()).add(dump.identity)
        self.rounds.note(dump)

    def _find_shared_folders(self, warn: Warn) -> None:
        """The training dumps that two processes' logs name. msprobe names its step folders by rank only, so two jobs
        on one dump root, or two processes that both took rank 0, write the same ``step{N}/rank{R}`` and the later
        overwrites the earlier: what such a folder holds cannot be told apart, and none of it is paired."""
        logs_of: dict[str, set[str]] = defaultdict(set)
        pid_of: dict[str, int | None] = {}
        for dump in self.trains:
            logs_of[train_dump(dump)].add(dump.log)
            pid_of[dump.log] = dump.pid
        shared: dict[frozenset[str], list[str]] = defaultdict(list)
        for folder, logs in logs_of.items():
            if len(logs) > 1:
                shared[frozenset(logs)].append(folder)
        for writers_logs, dumps in shared.items():
            writers = ", ".join(f"pid {pid_of[log]} ({log})" for log in sorted(writers_logs))
            shown = ", ".join(sorted(dumps)[:3]) + (f" and {len(dumps) - 3} more" if len(dumps) > 3 else "")
            warn(
                f"{len(dumps)} training dump(s) written by {len(writers_logs)} processes, {writers}: {shown}; "
                "msprobe names its step folders by rank only, so one process overwrote the other's (two jobs on one "
                "dump root, or two processes that both took that rank): not paired"
            )
            self.overwritten.update(dumps)

    def _find_unlisted_folders(self, roots: set[str], warn: Warn) -> None:
        """The training dumps under the training roots that no log line lists. The hooks log a dump after msprobe
        wrote it, so a process killed while dumping (a worker lost mid-dump) leaves its last folder unlisted, with
        msprobe's empty ``dump.json`` or a part of it: named here, never paired (nothing says what it holds)."""
        listed = {train_dump(dump) for dump in self.trains}
        unlisted = sorted(path for root in roots for path in layout.dumps_under(root) if path not in listed)
        if unlisted:
            shown = ", ".join(unlisted[:3]) + (f" and {len(unlisted) - 3} more" if len(unlisted) > 3 else "")
            warn(
                f"{len(unlisted)} training dump(s) that no training log line lists: {shown}; the process writing "
                "them stopped before logging them (killed while dumping?): not paired"
            )

    def _add_step(self, step: GenerateStep | DecodeStep) -> None:
        if isinstance(step, DecodeStep):
            self.seen_bases.update(step.bases)
            self.seen_hashes.update(step.hashes)
            return
        self.steps.append(step)
        if step.dumped is not False:  # its rows that sample a response token may pair with a training sequence
            self._add_sampling_rows(step)
        if has_prefill(step):
            self._add_prefill(step)
        else:  # a dumped decode step
            self.seen_bases.update(row.base for row in step.rows if row.base is not None)

    def _add_sampling_rows(self, step: GenerateStep) -> None:
        for row in step.rows:
            candidate = Candidate(step, row)
            after_prompt = row.prompt_len is not None and (candidate.position or 0) >= row.prompt_len
            if row.base is not None and (not row.prefill or after_prompt):
                self.decode_by_base.setdefault(row.base, []).append(candidate)

    def _add_prefill(self, step: GenerateStep) -> None:
        for row in step.rows:
            if row.base is not None:
                self.seen_bases.add(row.base)
            if row.prompt_hash is not None:
                self.seen_hashes.add(row.prompt_hash)
            if not row.prefill:
                continue
            candidate = Candidate(step, row)
            if row.base is not None:
                self.by_base.setdefault(row.base, []).append(candidate)
            if row.prompt_hash is not None:
                self.by_hash.setdefault(row.prompt_hash, []).append(candidate)

    def hash_ambiguous(self, dump: TrainDump, candidates: list[Candidate]) -> bool:
        """Whether the prompt hash points at more than one request, on either side (within a global step)."""
        if (
            dump.prompt_hash is not None
            and len(self._train_identities.get((dump.prompt_hash, dump.global_step), ())) > 1
        ):
            return True
        ids = {c.row.base for c in candidates if c.row.base is not None}
        if ids and (dump.request_base is not None or len(ids) > 1):
            return True  # ids on the inference side that the training side does not share
        per_rank = Counter(c.step.rank for c in candidates)  # id-less rows: one per request and rank
        return not ids and any(n > 1 for n in per_rank.values())


def has_prefill(step: GenerateStep) -> bool:
    return any(row.prefill for row in step.rows)
