"""Reading the two logs ``align`` joins, one line at a time.

* training: ``{actor dump_path}/{pid}/update_actor_log.jsonl``, one line per dumped micro-batch, or
  the published recipe's lines, which carry only ``request_ids``/``num_requests``;
* inference: ``{generate dump_path}/{pid}/dispatch_log.jsonl``, one line per model step, or the
  recipe's DispatchLogger lines (``phase`` and rows of ``request_id``/``type``/``tokens``).

A line that is not a usable record (not JSON, truncated, no integer ``step``) is reported with its
file and line number through ``warn`` and skipped; the rest of the file is still read (the policy of
:mod:`msprobe_hooks.jsonl`'s reader). Where the logs are: :mod:`msprobe_hooks.analysis.layout`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from msprobe_hooks import jsonl
from msprobe_hooks.join_keys import (
    DISPATCH_SOURCE,
    LAYER_OFFSET,
    PROMPT_HASH_VERSION_FIELD,
    PROMPT_WINDOW,
    strip_vllm_suffix,
    versioned_hash,
)

Warn = Callable[[str], None]

# Field names other writers use for what our logs call the first name (the recipe's DispatchLogger,
# the inference notes' proposed schema, Fully Async's top-level request ids).
ROW_FIELDS = {
    "request_id": ("request_id", "req_id", "rid"),
    "tokens": ("tokens", "num_tokens"),
    "computed_tokens": ("computed_tokens", "num_computed_before", "num_computed_tokens"),
    "prompt_len": ("prompt_len", "prompt_length", "num_prompt_tokens"),
    "full_prefill": ("full_prefill", "is_full_prompt"),
    "prefill": ("prefill", "is_prefill"),
}
TRAIN_REQUEST_IDS = ("request_ids", "inference_request_ids")


def _field(record: dict[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        if record.get(name) is not None:
            return record[name]
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _time(record: dict[str, Any]) -> float | None:
    value = record.get("time")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class TrainSample:
    """One sample a training dump holds, where its tokens sit in the dumped forward."""

    index: int | None
    request_id: str | None
    prompt_len: int | None
    seq_len: int | None
    offset: int | None  # its first token in the dumped forward's packed input (None: the log does not say)

    @property
    def request_base(self) -> str | None:
        return None if self.request_id is None else strip_vllm_suffix(self.request_id)


@dataclass(frozen=True)
class TrainDump:
    """One training dump (a log line) and, when it holds exactly one sample, that sample's keys."""

    log: str
    line: int
    pid: int | None
    rank: int | None
    step: int
    samples: int  # how many samples the dump holds (0: the line does not say)
    recipe: bool  # a published-recipe line (no per-sample fields)
    global_step: Any = None
    micro_batch: Any = None
    time: float | None = None  # when the line was written (seconds since the epoch); None in older logs
    kind: str | None = None  # "prompt" (PROMPTS_ONLY=1), "sequence" (DUMP_SEQUENCES=1) or "micro_batch"
    layer_offset: int | None = None  # Megatron: the dumped pipeline stage's first layer (None: 0, or not said)
    index: int | None = None
    uid: str | None = None
    session_id: Any = None
    request_id: str | None = None
    prompt_len: int | None = None
    prompt_hash: str | None = None
    seq_len: int | None = None
    members: tuple[TrainSample, ...] = ()  # every sample our log lists (decode pairs cut their rows)

    @property
    def request_base(self) -> str | None:
        return None if self.request_id is None else strip_vllm_suffix(self.request_id)

    @property
    def identity(self) -> Any:
        """Which sample this is, the same on every rank that dumped it (Megatron TP replicas)."""
        if self.request_base is not None:
            return self.request_base
        return (self.global_step, self.uid, self.session_id, self.index)

    @property
    def prompt_only(self) -> bool:
        """The dump holds the prompt alone: a PROMPTS_ONLY=1 prompt dump, a trimmed micro-batch, or a
        recipe line (the recipe trims the responses)."""
        if self.kind == PROMPT_WINDOW:
            return True
        return self.seq_len is None or self.prompt_len is None or self.seq_len == self.prompt_len


class GenerateRow(NamedTuple):
    """One request's share of a model step (a tuple: a long log has millions)."""

    request_id: str | None
    base: str | None  # engine suffix stripped
    prefill: bool
    full: bool | None  # the whole prompt in this step; None: the log does not say (recipe)
    tokens: int | None
    offset: int | None
    prompt_len: int | None
    prompt_hash: str | None
    computed: int | None = None  # tokens computed before this step: a decode row's position in its sequence


@dataclass(frozen=True)
class GenerateStep:
    """One inference model step of one process: one with a prefill row, or a dumped decode step."""

    log: str
    line: int
    pid: int | None
    rank: int | None
    step: int
    dumped: bool | None  # None: the log does not say (recipe: it logs dumped steps only)
    engine: str | None
    total_tokens: int | None
    rows: tuple[GenerateRow, ...]
    recipe: bool
    time: float | None = None  # when the step's line was written; None in older and recipe logs


def _records(path: str, warn: Warn, shortcut: Callable[[str], Any] | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, record) for every usable line of a log (:func:`msprobe_hooks.jsonl.records`); bad lines,
    and records without an integer ``step``, are reported.

    ``shortcut(line)``, when given, may answer for a line without parsing it (None: parse it).
    """
    try:
        for number, record in jsonl.records(path, lambda bad: warn(str(bad)), shortcut):
            # A dict is a parsed line (a shortcut answers in its own type).
            if isinstance(record, dict) and _int(record.get("step")) is None:
                warn(f"{path}:{number}: not a log record (expected a JSON object with an integer step); line skipped")
                continue
            yield number, record
    except OSError as exc:
        warn(f"{path}: cannot read the log ({exc.strerror})")


def read_training(path: str, warn: Warn) -> Iterator[TrainDump]:
    """The dumps listed by one ``update_actor_log.jsonl`` (ours or the recipe's)."""
    for number, record in _records(path, warn):
        common = {
            "log": path,
            "line": number,
            "pid": _int(record.get("pid")),
            "rank": _int(record.get("rank")),
            "step": record["step"],
            "global_step": record.get("global_step"),
            "micro_batch": record.get("micro_batch"),
            "time": _time(record),
            "kind": record.get("dump"),
            "layer_offset": _int(record.get(LAYER_OFFSET)),
        }
        version = _hash_version(record)
        samples = record.get("samples")
        if isinstance(samples, list):
            members = tuple(_member(s, len(samples)) for s in samples if isinstance(s, dict))
            if len(samples) != 1 or not isinstance(samples[0], dict):
                yield TrainDump(samples=len(samples), recipe=False, members=members, **common)
                continue
            sample = samples[0]
            request_id = sample.get("request_id")
            if request_id is None and sample.get("request_ids"):
                request_id = sample["request_ids"][0]
            yield TrainDump(
                samples=1,
                recipe=False,
                index=_int(sample.get("index")),
                uid=sample.get("uid"),
                session_id=sample.get("session_id"),
                request_id=None if request_id is None else str(request_id),
                prompt_len=_int(sample.get("prompt_len")),
                prompt_hash=versioned_hash(sample.get("prompt_hash"), version),
                seq_len=_int(sample.get("seq_len")),
                members=members,
                **common,
            )
            continue
        # The published recipe: request ids only, one per sample of the micro-batch.
        ids = _field(record, TRAIN_REQUEST_IDS)
        ids = [str(i) for i in ids if i is not None] if isinstance(ids, list) else []
        count = _int(record.get("num_requests"))
        count = len(ids) if count is None else count
        yield TrainDump(
            samples=count,
            recipe=True,
            request_id=ids[0] if count == 1 and ids else None,
            prompt_len=_int(_field(record, ROW_FIELDS["prompt_len"])),
            **common,
        )


def _member(sample: dict[str, Any], count: int) -> TrainSample:
    request_id = sample.get("request_id")
    if request_id is None and sample.get("request_ids"):
        request_id = sample["request_ids"][0]
    offset = _int(sample.get("offset"))
    return TrainSample(
        index=_int(sample.get("index")),
        request_id=None if request_id is None else str(request_id),
        prompt_len=_int(sample.get("prompt_len")),
        seq_len=_int(sample.get("seq_len")),
        offset=0 if offset is None and count == 1 else offset,  # a dump of one sample starts with it
    )


def _hash_version(record: dict[str, Any]) -> int:
    """The definition of a line's prompt hashes (1: a log from before the field)."""
    return _int(record.get(PROMPT_HASH_VERSION_FIELD)) or 1


def _row(raw: dict[str, Any], step_prefill: bool, single: bool, version: int) -> GenerateRow:
    if "full_prefill" in raw and "request_id_base" in raw:  # our own rows: every field under its name
        get = raw.get
        return GenerateRow(
            get("request_id"),
            get("request_id_base"),
            get("prefill") is True,
            get("full_prefill") is True,
            get("tokens"),
            get("offset"),
            get("prompt_len"),
            versioned_hash(get("prompt_hash"), version),
            get("computed_tokens"),
        )
    request_id = _field(raw, ROW_FIELDS["request_id"])
    request_id = None if request_id is None else str(request_id)
    base = raw.get("request_id_base")
    if base is None and request_id is not None:
        base = strip_vllm_suffix(request_id)
    tokens = _int(_field(raw, ROW_FIELDS["tokens"]))
    prompt_len = _int(_field(raw, ROW_FIELDS["prompt_len"]))
    computed = _int(_field(raw, ROW_FIELDS["computed_tokens"]))
    prefill = _field(raw, ROW_FIELDS["prefill"])
    full = _field(raw, ROW_FIELDS["full_prefill"])
    if not isinstance(prefill, bool):
        if computed is not None and prompt_len is not None:
            prefill = computed < prompt_len
        else:  # the recipe: a prefill step's new rows, or its only row (a later chunk)
            prefill = step_prefill and (raw.get("type") == "new" or single)
    if not isinstance(full, bool):
        if computed is not None and prompt_len is not None and tokens is not None:
            full = prefill and computed == 0 and tokens == prompt_len
        else:  # decided later against the training prompt's length
            full = None if prefill and raw.get("type", "new") == "new" else False
    return GenerateRow(
        request_id=request_id,
        base=None if base is None else str(base),
        prefill=bool(prefill),
        full=full if prefill else False,
        tokens=tokens,
        offset=_int(raw.get("offset")),
        prompt_len=prompt_len,
        prompt_hash=versioned_hash(raw.get("prompt_hash"), version),
        computed=computed,
    )


class DecodeStep(NamedTuple):
    """A model step without prefill rows that was not dumped: all ``align`` needs of it (most lines of a
    long log). A dumped one is read whole (a :class:`GenerateStep`): decode pairs need its rows."""

    dumped: bool | None
    bases: list[str]  # the requests it ran (suffix stripped) and their prompt hashes: a training
    hashes: list[str]  # dump whose request shows up only here is "decode only", not "no counterpart"


# Our own lines, as JsonlLog writes them (compact separators, fields in dispatch_log.step_line's order):
# one without a prefill row is read by a scan instead of json.loads, 2-3 times faster.
_OUR_LINE = json.dumps({"source": DISPATCH_SOURCE, "engine": None}, separators=(",", ":"))[:-5]
_BASE = re.compile(r'"request_id_base":"([^"\\]*(?:\\.[^"\\]*)*)"')  # a JSON string, escapes and all
_HASH = re.compile(r'"prompt_hash":"([0-9a-f]*)"')
_VERSION = re.compile(f'"{PROMPT_HASH_VERSION_FIELD}":(\\d+)')


def _unescape(text: str) -> str:
    return json.loads(f'"{text}"') if "\\" in text else text


def _decode_line(line: str) -> DecodeStep | None:
    if not line.startswith(_OUR_LINE) or '"prefill":true' in line or not line.rstrip().endswith("}"):
        return None
    if '"dumped":false' not in line:
        return None  # dumped (or not saying): read whole, its rows may pair with a training sequence
    version = _VERSION.search(line)
    hashes = _HASH.findall(line)
    if version is not None:
        hashes = [versioned_hash(h, int(version.group(1))) for h in hashes]
    return DecodeStep(False, [_unescape(b) for b in _BASE.findall(line)], hashes)


def read_dispatch(path: str, warn: Warn) -> Iterator[GenerateStep | DecodeStep]:
    """The model steps listed by one ``dispatch_log.jsonl`` (ours or the recipe's)."""
    for number, record in _records(path, warn, _decode_line):
        if isinstance(record, DecodeStep):
            yield record
            continue
        raw_rows = record.get("requests")
        if not isinstance(raw_rows, list) or not all(isinstance(r, dict) for r in raw_rows):
            warn(f"{path}:{number}: no requests list; line skipped")
            continue
        step_prefill = record.get("phase") != "decode"
        single = len(raw_rows) == 1
        dumped = record.get("dumped")
        dumped = dumped if isinstance(dumped, bool) else None
        version = _hash_version(record)
        rows = tuple(_row(raw, step_prefill, single, version) for raw in raw_rows)
        if dumped is False and not any(row.prefill for row in rows):
            bases = [row.base for row in rows if row.base is not None]
            yield DecodeStep(dumped, bases, [row.prompt_hash for row in rows if row.prompt_hash is not None])
            continue
        yield GenerateStep(
            log=path,
            line=number,
            pid=_int(record.get("pid")),
            rank=_int(record.get("rank")),
            step=record["step"],
            dumped=dumped,
            engine=record.get("engine"),
            total_tokens=_int(record.get("total_num_scheduled_tokens")),
            rows=rows,
            recipe="engine" not in record,
            time=_time(record),
        )
