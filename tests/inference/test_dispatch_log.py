"""The dispatch-log record shared by every engine: rows, phases, step numbering, prompt hashes."""

from __future__ import annotations

import json
import os
import threading

import pytest
from support.dispatch_lines import step_record

from msprobe_hooks import jsonl
from msprobe_hooks.inference import dispatch_log
from msprobe_hooks.inference.dispatch_log import (
    PromptHashes,
    RunnerLog,
    ScheduledRequest,
    StepCounter,
    current_rank,
    make_scheduled_request,
    open_log,
    phase,
    step_line,
)
from msprobe_hooks.join_keys import DISPATCH_LOG, prompt_hash
from msprobe_hooks.jsonl import JsonlLog


def request(rid: str, tokens: int, computed: int, prompt_len: int, new: bool = False) -> ScheduledRequest:
    return ScheduledRequest(rid, rid.split("-")[0], new, tokens, computed, prompt_len, prompt_hash(range(prompt_len)))


def test_prefill_and_full_prefill_per_row():
    full = request("a", 6, 0, 6, new=True)
    chunk = request("b", 2, 0, 10, new=True)  # first piece of a chunked prefill
    later_chunk = request("b", 8, 2, 10)
    cache_hit = request("c", 3, 4, 7, new=True)  # prefix-cache hit: prompt partly computed before
    decode = request("a", 1, 6, 6)
    recompute = request("d", 9, 0, 6)  # resumed after preemption: prompt plus outputs
    assert [r.prefill for r in (full, chunk, later_chunk, cache_hit, decode, recompute)] == [
        True,
        True,
        True,
        True,
        False,
        True,
    ]
    assert [r.full_prefill for r in (full, chunk, later_chunk, cache_hit, decode, recompute)] == [
        True,
        False,
        False,
        False,
        False,
        False,
    ]


def test_the_fast_constructor_makes_the_same_scheduled_request():
    fields = ("r-1", "r", True, 4, 0, 4, "h", False)
    made = make_scheduled_request(fields)
    assert type(made) is ScheduledRequest
    assert made == ScheduledRequest(*fields)
    assert (made.request_id_base, made.prefill, made.full_prefill) == ("r", True, True)
    assert len(fields) == len(ScheduledRequest._fields)  # every field given: nothing defaults on this path


def test_rows_of_a_line_are_the_scheduled_requests_with_their_offsets():
    """Rows are encoded from cached pieces, prefill / full_prefill inline: each must read back as the
    ScheduledRequest it came from, decode rows (their own template) and every other kind alike."""
    rows = [
        request("a", 6, 0, 6, new=True),
        request("b", 2, 0, 10, new=True),
        request("b", 8, 2, 10),
        request("c", 3, 4, 7, new=True),
        request("a", 1, 6, 6),  # a decode row
        request("a", 1, 6, 6, new=True),  # one token, yet new (a resumed request): not the decode template
        request("d", 9, 0, 6),
        request("f", 1, 0, 1, new=True),  # a one-token prompt: a full prefill of one token
        ScheduledRequest(None, None, True, 4, 0, None, None, mode_prefill=True),  # prompt unknown: the mode says
        ScheduledRequest("e", "e", False, 1, None, 5, None),  # computed unknown
        ScheduledRequest("é", "é", False, 2, 7, 5, "h"),  # two tokens of output (speculative decoding)
    ]
    offsets = [sum(r.tokens for r in rows[:i]) for i in range(len(rows))]
    expected = [
        {
            "request_id": r.request_id,
            "request_id_base": r.request_id_base,
            "type": "new" if r.new else "cached",
            "prefill": r.prefill,
            "tokens": r.tokens,
            "offset": offset,
            "computed_tokens": r.computed_tokens,
            "prompt_len": r.prompt_len,
            "prompt_hash": r.prompt_hash,
            "full_prefill": r.full_prefill,
        }
        for r, offset in zip(rows, offsets, strict=True)
    ]
    for _ in range(2):  # the second time from the cached pieces
        line = step_record(engine="sglang", engine_version=None, rank=None, step=0, dumped=False, requests=rows)
        assert line["requests"] == expected
        assert [list(row) for row in line["requests"]] == [list(row) for row in expected]  # the field order too
    assert (line["total_num_scheduled_tokens"], line["prefill_requests"]) == (sum(r.tokens for r in rows), 7)


def test_cached_row_pieces_are_bounded():
    for i in range(5000):  # 5000 requests come and go, one step each
        step_line(
            engine="vllm", engine_version=None, rank=0, step=i, dumped=False, requests=[request(f"r{i}", 1, 3, 3)]
        )
    assert len(dispatch_log._row_json) <= 4096 + 3


def test_row_constants_are_not_reused_across_prompts_or_ids():
    """A request id seen again with another prompt, and ids that need escaping, are written as they are."""
    first = ScheduledRequest('q"1\\é', "q", False, 1, 4, 4, "h1")
    again = ScheduledRequest('q"1\\é', "q", True, 3, 0, 3, "h2")  # same id, resubmitted with another prompt
    for rows in ([first], [again], [first, again]):
        line = step_record(engine="vllm", engine_version=None, rank=0, step=0, dumped=False, requests=rows)
        assert [(r["request_id"], r["prompt_len"], r["prompt_hash"]) for r in line["requests"]] == [
            (q.request_id, q.prompt_len, q.prompt_hash) for q in rows
        ]


def test_phase_of_a_step_is_one_of_the_published_two():
    """Scripts for the published DispatchLogger select phase == "prefill": a mixed step must be one."""
    assert phase([request("a", 6, 0, 6), request("b", 2, 0, 10)]) == "prefill"
    assert phase([request("a", 1, 6, 6), request("b", 1, 12, 10)]) == "decode"
    assert phase([request("a", 1, 6, 6), request("b", 7, 2, 10)]) == "prefill"
    assert phase([]) == "decode"


def test_prefill_requests_counts_the_prefill_rows():
    def line(*rows):
        return step_record(engine="vllm", engine_version=None, rank=0, step=0, dumped=False, requests=list(rows))

    mixed = line(request("a", 1, 6, 6), request("b", 7, 2, 10), request("c", 3, 0, 3))
    assert (mixed["phase"], mixed["prefill_requests"], mixed["num_requests"]) == ("prefill", 2, 3)
    decode = line(request("a", 1, 6, 6))
    assert (decode["phase"], decode["prefill_requests"]) == ("decode", 0)


def test_record_fields_offsets_and_totals():
    rows = [request("x-0a1b2c3d", 1, 6, 6), request("y-11112222", 7, 2, 10, new=True), request("z", 3, 4, 7)]
    record = step_record(engine="vllm", engine_version="0.23.0", rank=3, step=17, dumped=True, requests=rows)
    assert list(record)[:7] == ["source", "engine", "engine_version", "timestamp", "pid", "rank", "step"]
    assert record["source"] == "dispatch_logger"
    assert (record["pid"], record["rank"], record["step"], record["dumped"]) == (os.getpid(), 3, 17, True)
    assert (record["phase"], record["total_num_scheduled_tokens"], record["num_requests"]) == ("prefill", 11, 3)
    assert [(r["request_id"], r["offset"], r["tokens"]) for r in record["requests"]] == [
        ("x-0a1b2c3d", 0, 1),
        ("y-11112222", 1, 7),
        ("z", 8, 3),
    ]
    second = record["requests"][1]
    assert second == {
        "request_id": "y-11112222",
        "request_id_base": "y",
        "type": "new",
        "prefill": True,
        "tokens": 7,
        "offset": 1,
        "computed_tokens": 2,
        "prompt_len": 10,
        "prompt_hash": prompt_hash(range(10)),
        "full_prefill": False,
    }
    assert record["requests"][0] == {  # a decode row, written from its own template
        "request_id": "x-0a1b2c3d",
        "request_id_base": "x",
        "type": "cached",
        "prefill": False,
        "tokens": 1,
        "offset": 0,
        "computed_tokens": 6,
        "prompt_len": 6,
        "prompt_hash": prompt_hash(range(6)),
        "full_prefill": False,
    }


def test_log_file_is_per_process_under_the_root(tmp_path):
    log = open_log(str(tmp_path))
    log.write({"step": 0})
    jsonl.flush()
    assert (tmp_path / str(os.getpid()) / DISPATCH_LOG).read_text() == '{"step":0}\n'


@pytest.fixture
def idle_writer(monkeypatch) -> jsonl._Writer:
    """A writer whose thread never runs: what is on disk is what the steps themselves wrote."""
    idle = jsonl._Writer()
    idle.thread = threading.current_thread()  # "started": no thread of its own is started
    monkeypatch.setattr(jsonl, "_writer", idle)
    return idle


def test_a_step_hands_its_line_over_and_finds_every_earlier_one_on_disk(tmp_path, idle_writer):
    runner = RunnerLog("vllm", "0.32.0", open_log(str(tmp_path)))
    path = tmp_path / str(os.getpid()) / DISPATCH_LOG
    rows = [make_scheduled_request(("a", "a", False, 1, 5, 4, "h", False))]

    def on_disk() -> list[int]:
        return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []

    for step in range(5):
        runner.write(step, False, rows, rank=0)
        assert on_disk() == list(range(step))  # its own line handed over; each earlier one written (by the step)
    runner.write(5, True, rows, rank=0)  # a dumped step's line: on disk before its forward
    assert on_disk() == list(range(6))
    line = json.loads(path.read_text().splitlines()[0])
    assert line["requests"][0]["computed_tokens"] == 5 and line["rank"] == 0 and not idle_writer.waiting


def test_a_step_of_two_files_wakes_the_writer_once_and_never_writes_its_own_first_line(tmp_path, idle_writer):
    # vLLM's step hands over its new requests' lines (requests.jsonl) then its dispatch line: a second wake-up found
    # the thread busy with the first, and the step then wrote both itself.
    requests_log, dispatch = JsonlLog(str(tmp_path), "requests.jsonl", deferred=True), open_log(str(tmp_path))
    folder = tmp_path / str(os.getpid())

    def step(number: int) -> None:
        requests_log.write_later(str, (f'{{"request":{number}}}',), wake=False)
        assert idle_writer.doorbell.empty()  # not rung for a line of a step still being handed over
        assert not (folder / "requests.jsonl").exists() or f'"request":{number}' not in on_disk("requests.jsonl")
        dispatch.write_later(str, (f'{{"step":{number}}}',))
        assert idle_writer.doorbell.get_nowait() is None and idle_writer.doorbell.empty()  # rung once

    def on_disk(name: str) -> str:
        return (folder / name).read_text()

    step(0)
    assert not folder.exists()  # both lines of step 0 wait for the thread: nothing written on the step
    step(1)  # step 0's lines (the thread lags) are written by step 1 before its own, never step 1's
    assert on_disk("requests.jsonl") == '{"request":0}\n' and on_disk("dispatch_log.jsonl") == '{"step":0}\n'
    jsonl.flush()
    assert on_disk("requests.jsonl").splitlines()[1] == '{"request":1}' and not idle_writer.waiting


def test_steps_at_a_steady_pace_are_written_on_the_writers_timer_not_rung_for(tmp_path, idle_writer, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(jsonl.time, "monotonic", lambda: clock[0])
    log = open_log(str(tmp_path))
    rung: list[bool] = []

    def step(at: float) -> None:
        clock[0] = at
        log.write_later(str, (f'{{"at":{at}}}',))
        rung.append(not idle_writer.doorbell.empty())
        while not idle_writer.doorbell.empty():
            idle_writer.doorbell.get_nowait()

    def thread_writes(at: float) -> float | None:
        """The writer thread's part once woken at ``at``: the lines written, its timer set (None: wait to be rung)."""
        idle_writer.drain()
        with idle_writer.guard:
            return idle_writer.next_wake(at)

    for at in (100.000, 100.010):  # the first steps: no pace yet
        step(at)
        assert thread_writes(at + 0.001) is None
    step(100.020)  # two intervals of 10 ms: steady; the timer is set for a tenth of a step after the next
    assert thread_writes(100.021) == pytest.approx(0.020 + 0.011 - 0.021)
    step(100.030)  # not rung: the timer wakes the thread at 100.031 and it finds the line
    assert idle_writer.timer_finds_lines() and thread_writes(100.031) == pytest.approx(0.010)
    # a step later than the timer: the thread finds nothing and waits to be rung, and that step rings
    assert not idle_writer.timer_finds_lines() and not idle_writer.timed
    step(100.050)
    assert thread_writes(100.051) is None  # 10 ms then 20 ms: not steady
    step(100.125)  # and slower steps than STEADY_STEPS_UP_TO_S always ring
    step(100.205)
    assert thread_writes(100.206) is None
    assert rung == [True, True, True, False, True, True, True]
    assert (tmp_path / str(os.getpid()) / DISPATCH_LOG).read_text().count("\n") == 7


def test_a_timer_that_finds_only_an_unfinished_step_waits_for_its_ring(tmp_path, idle_writer):
    requests_log = JsonlLog(str(tmp_path), "requests.jsonl", deferred=True)
    idle_writer.timed = True
    requests_log.write_later(str, ('{"request":1}',), wake=False)  # the step's dispatch line comes next
    assert not idle_writer.timer_finds_lines() and not idle_writer.timed
    open_log(str(tmp_path)).write_later(str, ('{"step":1}',))
    assert not idle_writer.doorbell.empty()  # rung: the thread's timer is no longer set


def test_a_line_that_cannot_be_built_is_said_once_and_the_others_are_written(tmp_path, idle_writer, hook_warnings):
    log = open_log(str(tmp_path))

    def broken(value: int) -> str:
        raise ValueError(f"bad {value % 2}")

    log.write_later(broken, (2,))
    log.write_later(str, ('{"step":1}',))
    log.write_later(broken, (4,))
    jsonl.flush()
    assert (tmp_path / str(os.getpid()) / DISPATCH_LOG).read_text() == '{"step":1}\n'
    assert hook_warnings() == [f"a line of {DISPATCH_LOG} could not be built (ValueError: bad 0); the job goes on"]


def test_rank_is_zero_without_torch_distributed():
    assert current_rank() == 0


class _Service:
    def __init__(self, loop: int, init_step: int, finished: bool) -> None:
        self.loop, self.init_step, self.should_stop_service = loop, init_step, finished


class _Debugger:
    def __init__(self, loop: int, init_step: int = 0, finished: bool = False) -> None:
        self.service = _Service(loop, init_step, finished)


def test_step_numbers_follow_msprobe_then_go_on_after_it_finished():
    counter = StepCounter()
    assert [counter.take() for _ in range(2)] == [0, 1]  # no debugger: own count
    assert counter.take(_Debugger(loop=5, init_step=10)) == 15  # msprobe's step{N}
    frozen = _Debugger(loop=6, init_step=10, finished=True)  # step filter exhausted: msprobe stopped counting
    assert [counter.take(frozen), counter.take(frozen)] == [16, 17]


def test_prompt_hash_is_computed_once_per_prompt_object():
    hashes = PromptHashes()
    prompt = [3, 1, 4, 1, 5]
    assert hashes.get("r", prompt) == prompt_hash(prompt)
    hashes._known["r"] = (prompt, "cached")  # what a second lookup must reuse
    assert hashes.get("r", prompt) == "cached"
    resubmitted = [2, 7, 1]  # same id, another prompt object (abort and resubmit)
    assert hashes.get("r", resubmitted) == prompt_hash(resubmitted)
    assert hashes.get("e", None) is None  # prompt given as embeddings


def test_prompt_hashes_forget_finished_requests():
    hashes = PromptHashes()
    prompts = {f"r{i}": [i] for i in range(100)}
    for rid, prompt in prompts.items():
        hashes.get(rid, prompt)
    hashes.retain({"r1": None, "r2": None})
    assert set(hashes._known) == {"r1", "r2"}
    hashes.retain(set())  # few entries: nothing to reclaim yet
    assert set(hashes._known) == {"r1", "r2"}
