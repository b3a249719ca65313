"""What the prefill join and the decode join share: the index, the dump probe, the rules that choose among
candidates (the rollout round, the rank, a packed step cut to one request), the ledger of their decisions, and
the pair as written."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, TypeVar

from msprobe_hooks.analysis import layout
from msprobe_hooks.analysis.dumpfile import DumpProbe
from msprobe_hooks.analysis.pairing.candidates import (
    Candidate,
    CandidateIndex,
    LineKey,
    generate_dump,
)
from msprobe_hooks.analysis.pairing.logs import GenerateRow, GenerateStep, TrainDump, Warn
from msprobe_hooks.analysis.pairing.pairs import (
    LOG_FORMATS,
    PROCESS_FILES,
    GenerateSide,
    JoinRule,
    Pair,
    RankRule,
    Shard,
    TrainSide,
)
from msprobe_hooks.analysis.results import Backend, Unpaired

BACKENDS = tuple(backend.value for backend in Backend)  # --backend's choices
C = TypeVar("C", bound=Candidate)


@dataclass
class Ledger:
    """What the joins decided of the inference steps, by log line: what the unpaired reasons read."""

    used: set[LineKey] = field(default_factory=set)  # in a pair
    refused: dict[LineKey, Unpaired] = field(default_factory=dict)  # why one did not pair with the dump that wanted it
    paired_requests: set[str] = field(default_factory=set)  # request ids (or prompt hashes) with a prefill pair
    past: set[LineKey] = field(default_factory=set)  # dumped steps with a row past a sequence's last response token


@dataclass
class Join:
    """One ``align`` run's shared state; ``out_dir`` is the pairs file's folder, ``backend`` one of
    :data:`BACKENDS`, ``config_request_ids`` the generate config's ``request_id`` filter."""

    index: CandidateIndex
    probe: DumpProbe
    warn: Warn
    out_dir: str
    backend: str = BACKENDS[0]
    config_request_ids: frozenset[str] = frozenset()
    ledger: Ledger = field(default_factory=Ledger)
    _gap_logs_of: dict[str, list[str] | None] = field(default_factory=dict)  # training root -> its gap logs
    _found: dict[tuple[str, str], str | None] = field(default_factory=dict)  # (process folder, field) -> its file

    def same_round(self, dump: TrainDump, candidates: list[Candidate]) -> list[Candidate]:
        """The candidates of the rollout that produced ``dump``'s sample; the others are refused.

        Only in a run of several global steps with times on both sides (older logs: every candidate).
        A prompt comes back every epoch: without this a prompt-hash join could pair global step 3's
        training forward with step 1's rollout.
        """
        rounds = self.index.rounds
        if not rounds.tell(dump.global_step):
            return candidates
        kept = [c for c in candidates if rounds.of(c.step) == dump.global_step]
        self.ledger.refused.update((c.key, Unpaired.OTHER_STEP) for c in candidates if c not in kept)
        return kept

    def rank(self, good: list[C], rank: int | None) -> tuple[list[C], RankRule] | Unpaired:
        """The candidates at the rank a training dump of ``rank`` pairs with, and the rule that chose it."""
        same = [c for c in good if c.step.rank == rank]
        if same:
            return same, RankRule.SAME
        if self.backend == Backend.FSDP:
            lowest = min(-1 if c.step.rank is None else c.step.rank for c in good)
            return [c for c in good if (-1 if c.step.rank is None else c.step.rank) == lowest], RankRule.FSDP_ANY
        self.ledger.refused.update((c.key, Unpaired.OTHER_RANKS_ONLY) for c in good)
        return Unpaired.OTHER_RANKS_ONLY

    def filtered(self, step: GenerateStep, row: GenerateRow) -> bool:
        """A packed step whose dump msprobe's ``request_id`` filter cut to ``row``'s request."""
        if self.config_request_ids & {row.request_id, row.base}:
            return True
        if row.tokens is None or sum(1 for r in step.rows if r.tokens == row.tokens) > 1:
            return False  # the dumped count could be any of several rows'
        return self.probe.tokens(generate_dump(step)) == row.tokens

    # --- the pair as written -----------------------------------------------------------------------

    def pair(
        self,
        dump: TrainDump,
        train_path: str,
        chosen: Candidate,
        rule: JoinRule,
        key: str,
        rank_rule: RankRule,
        prompt_len: int | None,
    ) -> Pair:
        """The pair of ``dump`` (its dump at ``train_path``) and ``chosen``; numbered when the run collects it."""
        step, row = chosen.step, chosen.row
        pair = Pair(
            pair=0,
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
                dump=self._path(generate_dump(step)),
                **self._whence(step),
                engine=step.engine,
                request_id=row.request_id,
                filtered=len(step.rows) > 1,
                num_requests=len(step.rows),
                offset=row.offset,
                tokens=row.tokens,
                format=LOG_FORMATS[step.recipe],
                request_index=step.rows.index(row),
            ),
        )
        for side, log in ((pair.train, dump.log), (pair.generate, step.log)):
            for name, path in self._process_files(log, PROCESS_FILES[side.SIDE]).items():
                setattr(side, name, path)
        return pair

    def shard(self, candidate: Candidate) -> Shard:
        return Shard(dump=self._path(generate_dump(candidate.step)), **self._whence(candidate.step))

    def _gap_logs(self, log: str) -> list[str] | None:
        """The gap logs of a training log's root, as the pairs file names them; None when there are none."""
        root = layout.log_root(log)
        if root not in self._gap_logs_of:
            self._gap_logs_of[root] = [self._path(gap) for gap in layout.gap_logs(root)] or None
        return self._gap_logs_of[root]

    def _process_files(self, log: str, names: tuple[str, ...]) -> dict[str, str | None]:
        """The side files beside a process's log (:data:`.pairs.PROCESS_FILES`), as the pairs file names them; None
        where not written."""
        process = layout.process_folder(log)
        for name in names:
            if (process, name) not in self._found:
                found = layout.PROCESS_FILES[name](process)
                self._found[process, name] = self._path(found) if os.path.isfile(found) else None
        return {name: self._found[process, name] for name in names}

    def _whence(self, entry: TrainDump | GenerateStep) -> dict[str, Any]:
        """Where a side of a pair was logged: its msprobe step, rank, process, log file and line."""
        return {
            "step": entry.step,
            "rank": entry.rank,
            "pid": entry.pid,
            "log": self._path(entry.log),
            "line": entry.line,
        }

    def _path(self, path: str) -> str:
        """Relative to the pairs file's folder when under it (moves with it), else absolute."""
        path = os.path.abspath(path)
        if os.path.commonpath([path, self.out_dir]) == self.out_dir:
            return os.path.relpath(path, self.out_dir)
        return path
