"""The dispatch log: one JSON line per inference model step, the same for every engine.

A line says which requests one model forward ran, in the order their tokens are packed, how
many tokens each had computed before, the length and hash of each prompt, and whether msprobe
dumped that forward and under which ``step{N}`` folder. ``align`` uses it to tie a dumped
prefill to its request and prompt. The vLLM / vLLM-Ascend and SGLang patches build their lines
here so that both write one schema (``docs/inference-vllm.md`` describes it).

Files are ``{generate dump_path}/{pid}/dispatch_log.jsonl``, written through
:class:`~msprobe_hooks.jsonl.JsonlLog`: complete lines only, one file per process.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NamedTuple

from msprobe_hooks import debugger as debugger_module
from msprobe_hooks.join_keys import (
    DISPATCH_LOG,
    DISPATCH_SOURCE,
    PROMPT_HASH_VERSION,
    PROMPT_HASH_VERSION_FIELD,
    clock,
    prompt_hash,
    timestamp,
)
from msprobe_hooks.jsonl import JsonlLog, current_pid, encode, flush


class ScheduledRequest(NamedTuple):
    """One request's share of a model step, in the engine's packed token order."""

    request_id: str | None  # raw, as the engine sees it (None: the engine did not say)
    request_id_base: str | None  # the id the client sent (engine suffix stripped)
    new: bool  # first time the engine schedules it (else it was running, or resumed)
    tokens: int  # scheduled in this step
    computed_tokens: int | None  # computed before this step (> 0 on a prefix-cache hit or a later chunk)
    prompt_len: int | None
    prompt_hash: str | None  # None when the prompt is not token ids (embeddings), or unknown
    mode_prefill: bool = False  # what the engine's forward mode says, for rows whose prompt is unknown

    @property
    def prefill(self) -> bool:
        """This step computes prompt tokens of the request."""
        if self.computed_tokens is None or self.prompt_len is None:
            return self.mode_prefill
        return self.computed_tokens < self.prompt_len

    @property
    def full_prefill(self) -> bool:
        """The whole prompt in this one step, nothing computed before: the row to compare with training."""
        return self.prefill and self.computed_tokens == 0 and self.tokens == self.prompt_len


# ScheduledRequest(*fields), all eight given, without the Python-level __new__ of a NamedTuple:
# the engines make one per row per step, and that call alone cost a third of the row's budget.
make_scheduled_request: Callable[[tuple[Any, ...]], ScheduledRequest] = functools.partial(
    tuple.__new__, ScheduledRequest
)


class DeferredRows(Sequence[ScheduledRequest]):
    """A step's rows, made when first read. On a step that dumps nothing only the dispatch log's writer thread reads
    them, so the step itself makes none, nor what they need (a new request's prompt hash: 20 us for 2,000 tokens)."""

    __slots__ = ("_length", "_make", "_rows")

    def __init__(self, length: int, make: Callable[[], list[ScheduledRequest]]) -> None:
        self._length = length
        self._make = make  # reads only what does not change once the step is over
        self._rows: list[ScheduledRequest] | None = None

    def made(self) -> list[ScheduledRequest]:
        rows = self._rows
        if rows is None:  # two threads may make them at once: the same rows either way
            rows = self._rows = self._make()
        return rows

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: Any) -> Any:
        return self.made()[index]

    def __iter__(self) -> Iterator[ScheduledRequest]:
        return iter(self.made())


def rows_of_columns(
    request_ids: Sequence[str],
    bases: Sequence[str | None],
    tokens: Sequence[int],
    computed_tokens: Sequence[int],
    prompt_lens: Sequence[int],
    prompt_hashes: Sequence[str | None],
) -> list[ScheduledRequest]:
    """The rows of running requests (none new) from the columns the engine holds them in, made in C."""
    columns = request_ids, bases, repeat(False), tokens, computed_tokens, prompt_lens, prompt_hashes, repeat(False)
    return list(map(make_scheduled_request, zip(*columns, strict=False)))  # repeat(): endless


def _phase(prefill_rows: int) -> str:
    return "prefill" if prefill_rows else "decode"


def phase(requests: Sequence[ScheduledRequest]) -> str:
    """``prefill`` when any row computes prompt tokens, else ``decode`` (an empty step too).

    The published DispatchLogger's two values: scripts select ``phase == "prefill"``, so a step
    mixing prefill and decode rows is ``prefill``. ``prefill_requests`` and each row's ``prefill``
    say which rows are.
    """
    return _phase(sum(1 for r in requests if r.prefill))


# Every model step of the rollout writes a line, dumped or not, and most of its rows are running
# requests whose id, prompt length and hash do not change between steps. Their JSON is encoded once
# per request and kept here; a row then costs one string format instead of a dict and its encoding.
_RowKey = tuple[str | None, str | None, int | None, str | None]  # request_id, base, prompt_len, prompt_hash
_row_json: dict[_RowKey, tuple[str, str, str, str]] = {}
# Dicts, not tuples indexed by the bool: a numpy bool (from numpy counters) must work too.
_TYPE_JSON = {False: '"cached"', True: '"new"'}  # by ScheduledRequest.new
_BOOL_JSON = {False: "false", True: "true"}
_HASH_VERSION = f'"{PROMPT_HASH_VERSION_FIELD}":{PROMPT_HASH_VERSION},'  # the rows' prompt_hash definition


def _encode_row_constants(key: _RowKey) -> tuple[str, str, str, str]:
    """A row's JSON around its per-step values: before ``type`` and after ``computed_tokens``, then the
    same for a decode row (cached, not prefill, one token), around its ``offset`` and ``computed_tokens``."""
    request_id, base, prompt_len, prompt_hash = key
    head = f'{{"request_id":{encode(request_id)},"request_id_base":{encode(base)},"type":'
    tail = f',"prompt_len":{encode(prompt_len)},"prompt_hash":{encode(prompt_hash)},"full_prefill":'
    return head, tail, f'{head}"cached","prefill":false,"tokens":1,"offset":', f"{tail}false}}"


def step_line(
    engine: str,
    engine_version: str | None,
    rank: int | None,
    step: int,
    dumped: bool,
    requests: Sequence[ScheduledRequest],
    forward_mode: str | None = None,
    at: float | None = None,
) -> str:
    """One dispatch-log line, JSON-encoded (published recipe fields first, then what alignment needs).

    ``requests`` rows carry their token ``offset`` in the packed batch. ``forward_mode`` is the
    engine's own name for the step (SGLang's ForwardMode), when it has one. ``at``: when the step ran
    (seconds since the epoch; None: now), for a line the writer thread builds later.
    """
    if at is None:
        at = time.time()
    if len(_row_json) > 2 * len(requests) + 4096:
        _row_json.clear()  # mostly finished requests by now; the running ones are encoded again once
    rows: list[str] = []
    append = rows.append
    offset = prefill_rows = 0
    for request_id, base, new, tokens, computed, prompt_len, hashed_prompt, mode_prefill in requests:
        key = (request_id, base, prompt_len, hashed_prompt)
        constants = _row_json.get(key) or _row_json.setdefault(key, _encode_row_constants(key))
        # ScheduledRequest.prefill and .full_prefill, inline: two property calls cost more than the row
        if computed is None or prompt_len is None:
            prefill = mode_prefill
        elif computed < prompt_len:
            prefill = True
        elif tokens == 1 and not new:  # a running request's decode: most rows, the shortest path
            append(f'{constants[2]}{offset},"computed_tokens":{computed}{constants[3]}')
            offset += 1
            continue
        else:
            prefill = False
        full_prefill = prefill and computed == 0 and tokens == prompt_len
        computed_json = "null" if computed is None else computed
        append(
            f'{constants[0]}{_TYPE_JSON[new]},"prefill":{_BOOL_JSON[prefill]},"tokens":{tokens},"offset":{offset},'
            f'"computed_tokens":{computed_json}{constants[1]}{_BOOL_JSON[full_prefill]}}}'
        )
        offset += tokens
        prefill_rows += prefill
    mode = "" if forward_mode is None else f',"forward_mode":{encode(forward_mode)}'
    return (
        f'{_line_head(engine, engine_version)}"timestamp":"{timestamp(at)}","pid":{current_pid()},'
        f'"rank":{_scalar_json(rank)},"step":{_scalar_json(step)},"dumped":{_scalar_json(dumped)},'
        f'"phase":"{_phase(prefill_rows)}"{mode},"total_num_scheduled_tokens":{offset},'
        f'"num_requests":{len(requests)},"prefill_requests":{prefill_rows},"requests":[{",".join(rows)}],'
        f'{_HASH_VERSION}"time":{clock(at)}}}'  # ours, after the published fields
    )


# The line's head without json.dumps: one encode() of a small dict cost as much as ten decode rows.
@functools.lru_cache(maxsize=16)
def _line_head(engine: str, engine_version: str | None) -> str:
    """The fields every line of one engine shares, up to ``timestamp``."""
    return f'{{"source":"{DISPATCH_SOURCE}","engine":{encode(engine)},"engine_version":{encode(engine_version)},'


def _scalar_json(value: Any) -> str:
    """``encode(value)``, with plain ints and bools (the usual rank, step and dumped) done directly."""
    if value is True or value is False:
        return _BOOL_JSON[value]
    return str(value) if type(value) is int else encode(value)


def open_log(root: str) -> JsonlLog:
    """The dispatch log of this process under the generate dump root ``root``.

    Written at every model step: its lines are built and written by the writer thread, off the step, which
    looks whether the file was removed once a second, not at every line (an fstat a line cost 10-15 us).
    """
    return JsonlLog(root, DISPATCH_LOG, removal_check_s=1.0, deferred=True)


def distributed_ready() -> bool:
    """torch.distributed is imported and its default group is initialized."""
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    return dist is not None and dist.is_available() and dist.is_initialized()


def current_rank() -> int:
    """The torch.distributed rank (the ``rank{R}`` folder msprobe dumps into), 0 when not distributed."""
    return int(sys.modules["torch"].distributed.get_rank()) if distributed_ready() else 0


@dataclass(slots=True)
class StepWindow:
    """One msprobe step of a model runner, from its ``start()`` to the ``step()`` that ends it, and
    what its dispatch-log line will say (the training side's counterpart is ``actor_dump.DumpWindow``)."""

    step: int = 0
    started: bool = False  # msprobe's start() ran for this step
    dumped: bool = False
    requests: Sequence[ScheduledRequest] | None = None  # known once the runner's batch is
    forward_mode: str | None = None  # SGLang's ForwardMode name (its lines carry it)


class StepCounter:
    """Per-process step numbers that equal msprobe's ``step{N}`` folders.

    While a debugger runs, the number is msprobe's own (read after ``start()``); with no debugger,
    or once msprobe has shut itself down (its step filter exhausted, after which it stops
    counting), the count goes on from the last number, so lines never reuse a folder's number.
    """

    def __init__(self) -> None:
        self._next = 0
        self._lock = threading.Lock()

    def take(self, debugger: Any | None = None) -> int:
        with self._lock:
            if debugger is not None and not debugger_module.has_finished(debugger):
                number = debugger_module.next_step(debugger)
            else:
                number = self._next
            self._next = number + 1
            return number


class PromptHashes:
    """``prompt_hash`` per live request, computed once per request.

    Hashing every running request's prompt at every decode step would cost O(prompt length) per
    row per step. An entry is reused only for the very same token-id object, so a request id that
    comes back with another prompt (abort and resubmit) gets a fresh hash.
    """

    def __init__(self) -> None:
        self._known: dict[str, tuple[object, str]] = {}

    def get(self, request_id: str, token_ids: Sequence[int] | None) -> str | None:
        if token_ids is None:
            return None
        known = self._known.get(request_id)
        if known is not None and known[0] is token_ids:
            return known[1]
        value = prompt_hash(token_ids)
        self._known[request_id] = (token_ids, value)
        return value

    def retain(self, live: Any) -> bool:
        """Forget requests not in ``live`` (a container of ids) once finished ones pile up; True if it did."""
        if len(self._known) <= 2 * len(live) + 64:
            return False
        self._known = {k: v for k, v in self._known.items() if k in live}
        return True


class RunnerLog:
    """One model runner's dispatch log: the engine its lines name, their file, the rank they carry.

    The engine patches (vLLM / vLLM-Ascend, SGLang) subclass it with what they know of their steps;
    a line is written here, the same way for every engine.
    """

    def __init__(self, engine: str, engine_version: str | None, log: JsonlLog) -> None:
        self.engine = engine
        self.engine_version = engine_version
        self.log = log
        self.rank: int | None = None  # once torch.distributed is up: asking it costs more than a row
        self.last_line: tuple[int, bool, Sequence[ScheduledRequest]] | None = None  # step, dumped, rows (for routing)

    def write(
        self,
        step: int,
        dumped: bool,
        requests: Sequence[ScheduledRequest],
        forward_mode: str | None = None,
        rank: int | None = None,
    ) -> None:
        """One line: ``step`` is the msprobe folder the forward went to (``dumped`` if it did)."""
        if rank is None:
            rank = self.rank
            if rank is None:
                rank = current_rank()
                if distributed_ready():  # a worker's rank does not change once its group exists
                    self.rank = rank
        # The line is built off the step, from the rows as they are now (each step's list is a new one).
        args = (self.engine, self.engine_version, rank, step, dumped, requests, forward_mode, time.time())
        self.log.write_later(step_line, args)
        self.last_line = step, dumped, requests
        if dumped:  # the line that ties msprobe's dump to its requests: on disk before the forward runs
            flush()
