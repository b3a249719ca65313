"""The ``pairs.jsonl`` file that ``align`` writes and ``compare`` reads: one schema, here.

One line per pair; every field written on every line shown (two are written only when set: ``generate.shards``
and ``train.layer_offset``, below)::

    {"pair": 0, "rule": "request_id", "key": "job-3", "prompt_len": 12, "rank_rule": "same",
     "train":    {"dump": "...dump.json", "step": 3, "rank": 0, "pid": 811, "log": "...jsonl", "line": 4,
                  "global_step": 1, "micro_batch": 0, "sample": 0, "uid": "u-3", "request_id": "job-3",
                  "format": "msprobe-hooks", "rows": null},
     "generate": {"dump": "...dump.json", "step": 0, "rank": 0, "pid": 912, "log": "...jsonl", "line": 1,
                  "engine": "vllm", "request_id": "job-3-1a2b3c4d", "filtered": false, "num_requests": 1,
                  "offset": 0, "tokens": 12, "format": "msprobe-hooks", "rows": null},
     "kind": "prefill", "position": null, "token_index": null}

A decode pair (``kind`` "decode") compares one response token: ``position`` is the token's place in its
sequence (the decode row's ``computed_tokens``), ``token_index`` the response token whose log-prob that
row computes (``position - prompt_len + 1``: token 0's comes from the prefill); ``rows`` is
``[start, stop)`` of that token's rows in each dump (the training forward holds the whole sequence, a
packed decode step every request's row). ``rows`` null: the whole dump.

``rule`` says what joined the two sides (:class:`JoinRule`), ``key`` the value it joined on,
``rank_rule`` how the generate rank was chosen (:class:`RankRule`). ``filtered`` is true when the
inference step packed several requests and msprobe's ``request_id`` filter cut the dump to this one;
``offset``/``tokens`` are the request's rows in that step, ``request_index`` (written when known) its
place among the step's requests: its row of the logits the step samples from (``comparing/logits.py``).
``generate.shards``, only for an engine of several tensor-parallel ranks, lists the prefill's dump on every
rank of that engine (``rank``, ``pid``, ``step``, ``line``, ``dump``, ``log``; the pair's own ``generate`` rank
among them): compare makes the
split tensors whole from them (``analysis/comparing/shards.py``). ``train.layer_offset``, only where the training
log says it (Megatron), is the model's number of the dumped pipeline stage's first decoder layer (0 without pipeline
parallelism). ``line`` is the log line each side came from, ``format`` whose log it was (``msprobe-hooks`` or
the published ``recipe``).

The files beside each side's log that later stages read, written only when ``align`` found them:
``train.gap_logs``, every training process's ``logprob_gap.jsonl`` (the symptom: a sample's log-prob
pass may have run in another process than its update), and each side's ``routed_experts_log``, its
process's ``routed_experts.jsonl`` (the engine's MoE routing). A pairs file without them (an older
``align``) is read with them looked up where the dump trees' layout puts them
(:mod:`msprobe_hooks.analysis.layout`); no stage after this one finds a file by counting folders.

Paths are absolute, or relative to the folder of the pairs file (so a pairs file edited by hand, or
moved with its dump trees, still resolves); :func:`read` makes every one absolute. Unknown fields are
kept: a newer ``align`` may add some.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from msprobe_hooks import jsonl
from msprobe_hooks.analysis import layout

# The pairs file's words; results.py holds every enum of the analysis layer.
from msprobe_hooks.analysis.results import JoinRule as JoinRule
from msprobe_hooks.analysis.results import PairKind
from msprobe_hooks.analysis.results import RankRule as RankRule

SIDES = ("train", "generate")
LOG_FORMATS = ("msprobe-hooks", "recipe")


class PairsFileError(ValueError):
    """A pairs file line that ``compare`` cannot use; the message names the file and the line."""


@dataclass
class _Side:
    """What both sides of a pair say: the dump, and the log line that described it (where, which process)."""

    dump: str
    step: int | None = None
    rank: int | None = None
    pid: int | None = None
    log: str | None = None
    line: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # fields of a newer align, kept as they were read
    routed_experts_log: str | None = None  # its process's routed_experts.jsonl (MoE routing); None: none found


@dataclass
class TrainSide(_Side):
    """The training dump of a pair and the log line that described it."""

    SIDE: ClassVar[str] = "train"

    global_step: Any = None
    micro_batch: Any = None
    sample: int | None = None
    uid: str | None = None
    request_id: str | None = None
    format: str = LOG_FORMATS[0]
    rows: list[int] | None = None  # [start, stop) of the sample's token rows in the dump; None: all of them
    layer_offset: int | None = None  # Megatron pipeline stage: its layer 0 is the model's layer layer_offset
    gap_logs: list[str] | None = None  # every training process's logprob_gap.jsonl; None: none found
    engine_log: str | None = None  # its process's engine.jsonl (the engine's numerics settings); None: none found


@dataclass
class Shard:
    """One tensor-parallel rank's dump of a pair's inference prefill."""

    rank: int | None
    dump: str
    pid: int | None = None
    step: int | None = None
    line: int | None = None
    log: str | None = None


@dataclass
class GenerateSide(_Side):
    """The inference dump of a pair and the dispatch-log line of its step."""

    SIDE: ClassVar[str] = "generate"

    engine: str | None = None
    request_id: str | None = None
    filtered: bool = False
    num_requests: int | None = None
    offset: int | None = None
    tokens: int | None = None
    format: str = LOG_FORMATS[0]
    rows: list[int] | None = None  # [start, stop) of the request's token rows in the dump; None: all of them
    shards: list[Shard] | None = None  # every rank of a TP engine (TP > 1), in rank order; None: one rank
    engine_log: str | None = None  # its process's engine.jsonl (the engine's numerics settings); None: none found
    requests_log: str | None = None  # its process's requests.jsonl (sampling, prompt ids); None: none found
    request_index: int | None = None  # the request's place among its step's rows: its row of the step's logits


# Fields written only when set: a pair of a TP=1 engine, of a dense model, reads as it always has.
_OPTIONAL = frozenset(
    {"shards", "layer_offset", "gap_logs", "routed_experts_log", "engine_log", "requests_log", "request_index"}
)
# The files of a side's own process folder that later stages read, by field: where the layout puts them.
PROCESS_FILES: dict[str, tuple[str, ...]] = {
    "train": ("routed_experts_log", "engine_log"),
    "generate": ("routed_experts_log", "engine_log", "requests_log"),
}


@dataclass
class Pair:
    """One line of ``pairs.jsonl``."""

    pair: int
    rule: str
    key: str
    train: TrainSide
    generate: GenerateSide
    prompt_len: int | None = None
    rank_rule: str | None = None
    kind: PairKind = PairKind.PREFILL
    position: int | None = None  # decode: the token's position in its sequence (the row's computed_tokens)
    token_index: int | None = None  # decode: the response token whose log-prob that row computes (0: prefill's)
    extra: dict[str, Any] = field(default_factory=dict)

    # The order of a line's fields: as align has always written them, then the ones added since.
    _ORDER = ("pair", "rule", "key", "prompt_len", "rank_rule", "train", "generate", "kind", "position", "token_index")

    def record(self) -> dict[str, Any]:
        """The JSON object of the line (unknown fields read from a file come back after the known ones)."""
        record = {name: getattr(self, name) for name in self._ORDER}
        record["train"], record["generate"] = _side_record(self.train), _side_record(self.generate)
        return {**record, **self.extra}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Pair:
        known = {name: record[name] for name in cls._ORDER if name in record}
        if "kind" in known:
            known["kind"] = PairKind(known["kind"])
        known["train"] = _side(TrainSide, record["train"])
        known["generate"] = _side(GenerateSide, record["generate"])
        extra = {k: v for k, v in record.items() if k not in cls._ORDER}
        return cls(**{"rule": "", "key": "", **known}, extra=extra)


def _side_record(side: TrainSide | GenerateSide) -> dict[str, Any]:
    record = {
        f.name: getattr(side, f.name)
        for f in dataclasses.fields(side)
        if f.name != "extra" and not (f.name in _OPTIONAL and getattr(side, f.name) is None)
    }
    if record.get("shards") is not None:
        record["shards"] = [dataclasses.asdict(shard) for shard in record["shards"]]
    return {**record, **side.extra}


def _side(cls: type, record: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    known = {k: v for k, v in record.items() if k in names}
    if isinstance(known.get("shards"), list):
        fields = {f.name for f in dataclasses.fields(Shard)}
        known["shards"] = [Shard(**{k: v for k, v in s.items() if k in fields}) for s in known["shards"]]
    return cls(**known, extra={k: v for k, v in record.items() if k not in names})


def resolve(path: str, pairs_file: str) -> str:
    """A path of a pairs line, made absolute against the pairs file's folder."""
    return (
        path
        if os.path.isabs(path)
        else os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(pairs_file)), path))
    )


def write(pairs: Iterable[Pair], path: str) -> int:
    """Write ``pairs`` to ``path``, one JSON line each; returns how many."""
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for pair in pairs:
            out.write(json.dumps(pair.record(), separators=(",", ":"), ensure_ascii=False) + "\n")
            count += 1
    return count


def read(path: str) -> Iterator[Pair]:
    """The pairs of ``path``, every path resolved; a line that is not a usable pair raises PairsFileError.

    A pairs file of an older ``align`` names no side files (``train.gap_logs``, ``generate.routed_experts_log``):
    they are looked up where the dump trees' layout puts them (:mod:`msprobe_hooks.analysis.layout`)."""
    side_files = _SideFiles(path)
    for index, (number, record) in enumerate(jsonl.records(path, _refuse)):
        where = f"{path}:{number}"
        for side in SIDES:
            dump = record.get(side, {}).get("dump") if isinstance(record.get(side), dict) else None
            if not isinstance(dump, str) or not dump:
                raise PairsFileError(f"{where}: no {side}.dump path; each pair names both dump.json files")
            record[side]["dump"] = resolve(dump, path)
            _resolve_log(record[side], path)
        shards = record["generate"].get("shards")
        if shards is not None:
            if not isinstance(shards, list) or not all(
                isinstance(s, dict) and isinstance(s.get("dump"), str) and s["dump"] for s in shards
            ):
                raise PairsFileError(f"{where}: generate.shards must be a list of objects, each with a dump path")
            for shard in shards:
                shard["dump"] = resolve(shard["dump"], path)
                _resolve_log(shard, path)
        record["train"]["gap_logs"] = side_files.gap_logs(record["train"], where)
        for side, fields in PROCESS_FILES.items():
            for name in fields:
                record[side][name] = side_files.process_file(record[side], side, name, where)
        if record.get("kind", PairKind.PREFILL) not in list(PairKind):
            kinds = ", ".join(PairKind)
            raise PairsFileError(f"{where}: kind {record['kind']!r}; accepted: {kinds}")
        if not isinstance(record.setdefault("pair", index), int):
            raise PairsFileError(f"{where}: pair must be an integer (the pair's number)")
        yield Pair.from_record(record)


def _refuse(line: jsonl.BadLine) -> None:
    raise PairsFileError(f"{line.where}: {line.problem}; expected one pair per line")


def _resolve_log(side: dict[str, Any], pairs_file: str) -> None:
    if isinstance(side.get("log"), str) and side["log"]:
        side["log"] = resolve(side["log"], pairs_file)


class _SideFiles:
    """The side files of a pairs file's pairs: resolved where named, else found by the layout (once per folder)."""

    def __init__(self, pairs_file: str) -> None:
        self.pairs_file = pairs_file
        self._gap_logs: dict[str, list[str] | None] = {}  # training root -> its gap logs
        self._found: dict[tuple[str, str], str | None] = {}  # (process folder, field) -> its file, if written

    def gap_logs(self, train: dict[str, Any], where: str) -> list[str] | None:
        named = train.get("gap_logs")
        if named is not None:
            if not isinstance(named, list) or not all(isinstance(log, str) and log for log in named):
                raise PairsFileError(f"{where}: train.gap_logs must be a list of paths")
            return [resolve(log, self.pairs_file) for log in named]
        log = train.get("log")
        if not isinstance(log, str) or not log:
            return None
        root = layout.log_root(log)
        if root not in self._gap_logs:
            self._gap_logs[root] = layout.gap_logs(root) or None
        return self._gap_logs[root]

    def process_file(self, side: dict[str, Any], which: str, name: str, where: str) -> str | None:
        """The side's file ``name`` (a field of :data:`PROCESS_FILES`): as named, else where the layout puts it in
        the side's process folder, if it is there."""
        named = side.get(name)
        if named is not None:
            if not isinstance(named, str) or not named:
                raise PairsFileError(f"{where}: {which}.{name} must be a path")
            return resolve(named, self.pairs_file)
        log = side.get("log")
        if which == "generate":
            process = layout.generate_process(side["dump"])
        elif isinstance(log, str) and log:
            process = layout.process_folder(log)
        else:
            return None
        if (process, name) not in self._found:
            found = layout.PROCESS_FILES[name](process)
            self._found[process, name] = found if os.path.isfile(found) else None
        return self._found[process, name]
