"""vLLM worker processes: each logs and dumps under its own pid; a killed one leaves whole lines.

The stand-in MultiprocExecutor starts one worker per rank with vLLM's multiprocessing context
(VLLM_WORKER_MULTIPROC_METHOD: spawn, as vLLM forces inside a Ray actor, or fork, its default);
the children inherit the environment, so the shim activates in each.
"""

from __future__ import annotations

import json

import pytest
from support.vllm_standin import (
    MIXED,
    MIXED_ROWS,
    dispatch_log,
    dumped_steps,
    generate_config,
    row_tuples,
    run_scenario,
)

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_each_worker_process_logs_and_dumps_under_its_own_pid(tmp_path, method):
    config = generate_config(tmp_path, step=[0])
    scenario = {**MIXED, "backend": "mp", "world_size": 2}
    result = run_scenario(tmp_path, scenario, MSPROBE_GENERATE_CONFIG=str(config), VLLM_WORKER_MULTIPROC_METHOD=method)
    assert result.returncode == 0, result.stderr
    report = result.json()
    workers = report["worker_pids"]
    assert len(set(workers)) == 2 and report["pid"] not in workers
    root = tmp_path / "gen"
    assert sorted(p.name for p in root.iterdir()) == sorted(str(pid) for pid in workers)  # not the driver's
    for rank, pid in enumerate(workers):
        lines = dispatch_log(root, pid)
        assert {(line["pid"], line["rank"]) for line in lines} == {(pid, rank)}
        assert [row_tuples(line) for line in lines] == MIXED_ROWS
        assert [line["dumped"] for line in lines] == [True, False, False, False, False]
        assert dumped_steps(root, pid) == ["step0"]
        assert (root / str(pid) / "step0" / f"rank{rank}" / "dump.json").is_file()


def test_a_worker_killed_mid_run_leaves_only_whole_lines(tmp_path):
    # Long ids and many requests make each line several kilobytes, so a kill can land mid-write.
    requests = [
        {"id": f"request-{i:03d}-" + "x" * 200, "prompt": [1 + i % 50] * (8 + i % 5), "max_tokens": 50}
        for i in range(40)
    ]
    scenario = {"backend": "mp", "world_size": 1, "max_num_seqs": 40, "requests": requests, "kill_worker_at_step": 30}
    result = run_scenario(tmp_path, scenario, VLLM_WORKER_MULTIPROC_METHOD="spawn")
    assert result.returncode == 0, result.stderr
    (worker,) = result.json()["worker_pids"]
    text = (tmp_path / "out" / "generate" / str(worker) / "dispatch_log.jsonl").read_text()
    assert text.endswith("\n")
    lines = [json.loads(line) for line in text.splitlines()]
    assert len(lines) >= 30
    assert [line["step"] for line in lines] == list(range(len(lines)))
    assert all(line["num_requests"] == 40 for line in lines[1:30])
