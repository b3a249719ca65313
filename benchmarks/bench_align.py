"""Cost of ``align`` on a long dispatch log (issue 11: 100k lines, target <= 2 s).

Builds one rollout's logs: 1000 requests, each one single-request prefill step followed by 99
decode steps of 8 running requests (100k dispatch-log lines written by the real
``dispatch_log.step_line``), and 1000 training prompt dumps. Times the join (reading both logs,
pairing, writing ``pairs.jsonl``) against the floor of reading the same lines with ``json.loads``
alone, and prints medians and the ratio. The dump.json files are tiny: align opens each paired one
once, to check it is there.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator

from msprobe_hooks.analysis.layout import find_logs
from msprobe_hooks.analysis.pairing import align, pairs
from msprobe_hooks.inference import dispatch_log
from msprobe_hooks.inference.dispatch_log import ScheduledRequest, make_scheduled_request, step_line
from msprobe_hooks.join_keys import DISPATCH_LOG, TRAINING_LOG, prompt_hash
from msprobe_hooks.jsonl import JsonlLog

REQUESTS = 1000
DECODES = 99
RUNNING = 8
PROMPT_LEN = 512
REPEATS = 3
DUMP = '{"task": "statistics", "level": "L0", "framework": "pytorch", "dump_data_dir": null, "data": {}}'


def _write_dump(folder: str) -> None:
    os.makedirs(folder)
    with open(os.path.join(folder, "dump.json"), "w") as handle:
        handle.write(DUMP)


def write_training(train: str, hashes: list[str]) -> None:
    """The training side: one prompt-only dump per request and its log line (``{train}/{this pid}/...``)."""
    train_log = JsonlLog(train, TRAINING_LOG)
    for i, prompt in enumerate(hashes):
        sample = {"index": 0, "uid": f"u{i}", "session_id": 0, "request_id": f"req-{i}", "request_ids": [f"req-{i}"]}
        sample.update(prompt_len=PROMPT_LEN, prompt_hash=prompt, seq_len=PROMPT_LEN + 64)
        line = {"source": "update_actor", "pid": os.getpid(), "rank": 0, "step": i, "global_step": 1}
        line.update(phase="log_prob", micro_batch=i, dump="prompt", request_ids=[f"req-{i}"], num_requests=1)
        train_log.write({**line, "samples": [sample]})
        _write_dump(os.path.join(train, f"step{i}", "rank0"))


def model_steps(hashes: list[str], decodes: int) -> Iterator[tuple[int, bool, list[ScheduledRequest]]]:
    """(step, dumped, rows) of every model step, in log order: each request's prefill alone (dumped), then
    ``decodes`` decode steps of the last :data:`RUNNING` requests."""
    step = 0
    bases = [f"req-{i}" for i in range(len(hashes))]
    ids = [f"{base}-0123abcd" for base in bases]
    for i, prompt in enumerate(hashes):
        yield step, True, [ScheduledRequest(f"req-{i}-0123abcd", f"req-{i}", True, PROMPT_LEN, 0, PROMPT_LEN, prompt)]
        step += 1
        running = range(max(0, i - RUNNING + 1), i + 1)
        for k in range(1, decodes + 1):
            rows = [  # as the engines make them, without a NamedTuple's Python-level __new__
                make_scheduled_request((ids[j], bases[j], False, 1, PROMPT_LEN + k, PROMPT_LEN, hashes[j], False))
                for j in running
            ]
            yield step, False, rows
            step += 1


def write_dispatch(generate: str, hashes: list[str], decodes: int) -> None:
    """The inference side: every model step's line, by the real writer, and the prefill steps' dumps."""
    log = dispatch_log.open_log(generate)
    for step, dumped, rows in model_steps(hashes, decodes):
        line = step_line(engine="vllm", engine_version="0.32.0", rank=0, step=step, dumped=dumped, requests=rows)
        log.write_line(line)
        if dumped:
            _write_dump(os.path.join(generate, str(os.getpid()), f"step{step}", "rank0"))


def prompt_hashes(requests: int) -> list[str]:
    return [prompt_hash(range(i, i + PROMPT_LEN)) for i in range(requests)]


def build(root: str) -> tuple[str, str]:
    """Both trees, written by the real log writers (``{root}/{this pid}/...``)."""
    train, generate = os.path.join(root, "actor"), os.path.join(root, "generate")
    hashes = prompt_hashes(REQUESTS)
    write_training(train, hashes)
    write_dispatch(generate, hashes, DECODES)
    return train, generate


def _join(train: str, generate: str, out: str) -> int:
    result = align.pair_logs(find_logs(train, TRAINING_LOG), find_logs(generate, DISPATCH_LOG), os.path.dirname(out))
    pairs.write(result.pairs, out)
    return len(result.pairs)


def _floor(train: str, generate: str) -> int:
    count = 0
    for path in find_logs(train, TRAINING_LOG) + find_logs(generate, DISPATCH_LOG):
        with open(path) as handle:
            for line in handle:
                json.loads(line)
                count += 1
    return count


def _median(work, *args) -> tuple[float, object]:
    samples, value = [], None
    for _ in range(REPEATS):
        start = time.perf_counter()
        value = work(*args)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), value


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-align-") as root:
        train, generate = build(root)
        joined, pairs = _median(_join, train, generate, os.path.join(root, "pairs.jsonl"))
        floor, lines = _median(_floor, train, generate)
        size = os.path.getsize(dispatch_log.open_log(generate).path) / 1e6
    print(f"{lines} log lines ({size:.0f} MB dispatch log), {pairs} pairs, median of {REPEATS}")
    print(f"{'align s':>8} {'json.loads s':>13} {'ratio':>6}")
    print(f"{joined:8.2f} {floor:13.2f} {joined / floor:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
