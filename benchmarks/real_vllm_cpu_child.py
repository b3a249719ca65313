"""Our CPU time per model step inside the real vLLM engine; run by ``bench_real_vllm.py`` in ``.venv-vllm``.

Usage: ``python real_vllm_cpu_child.py SCENARIO.json ROUNDS`` with ``DUMP_ON=1`` and the shim on
PYTHONPATH (the hooks come from the environment, as in any job). ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
keeps the engine core and its worker in this process, so this benchmark-only script can time the
patch's per-step work from outside the library: it replaces the patch module's ``_record_step``
(everything the ``_update_states`` wrapper does after vLLM's own call) with a timed call of it, and
takes the time between two steps' calls as the step's: its wall time, and its CPU time on the thread
that runs the model (which includes that thread's share of the OpenMP regions, spin-waits too). The
dispatch log's lines are built and written by our writer thread, off the step: its CPU time is timed
the same way (around each of its writes) and reported apart.
Prints one JSON line: steps, rows a step, and microseconds per step of each.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from real_vllm_child import ENGINE_DEFAULTS, generate  # noqa: E402  (the tests' child: same engine, same requests)

PATCH_MODULE = "msprobe_hooks.patches.vllm.model_runner"


def main(scenario_path: str, rounds: int) -> None:
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0", "the engine must run in this process"
    from vllm import LLM

    with open(scenario_path, encoding="utf-8") as handle:
        scenario = json.load(handle)
    llm = LLM(model=scenario["model"], **ENGINE_DEFAULTS)
    patch = importlib.import_module(PATCH_MODULE)  # imported by the patch once vLLM's runner was
    record_step = patch._record_step
    totals = {"calls": 0, "ours_ns": 0, "writer_ns": 0, "rows": 0, "intervals": 0, "step_ns": 0, "step_wall_ns": 0}
    last_call = [0, 0]  # thread CPU and wall time at the last call; 0 at a generation's start

    from msprobe_hooks.patching import argument

    def timed_record_step(ctx, runner, state, args, kwargs):
        began, wall = time.thread_time_ns(), time.perf_counter_ns()
        if last_call[0]:
            totals["intervals"] += 1
            totals["step_ns"] += began - last_call[0]
            totals["step_wall_ns"] += wall - last_call[1]
        last_call[:] = began, wall
        try:
            return record_step(ctx, runner, state, args, kwargs)
        finally:
            totals["calls"] += 1
            totals["rows"] += len(argument(args, kwargs, "scheduler_output", 0).num_scheduled_tokens)
            totals["ours_ns"] += time.thread_time_ns() - began

    from msprobe_hooks import jsonl

    drain = jsonl._Writer.drain

    def timed_drain(writer):
        began = time.thread_time_ns()
        try:
            return drain(writer)
        finally:
            totals["writer_ns"] += time.thread_time_ns() - began

    generate(llm.llm_engine, scenario["waves"])  # warm-up
    jsonl.flush()
    jsonl._Writer.drain = timed_drain
    patch._record_step = timed_record_step
    for _ in range(rounds):
        generate(llm.llm_engine, scenario["waves"])
        last_call[:] = 0, 0  # the gap between two generations is no step
    jsonl.flush()
    calls = totals["calls"]
    print(
        "CPU "
        + json.dumps(
            {
                "steps": calls,
                "rows_per_step": totals["rows"] / calls,
                "ours_us": totals["ours_ns"] / calls / 1e3,
                "writer_us": totals["writer_ns"] / calls / 1e3,
                "step_us": totals["step_ns"] / totals["intervals"] / 1e3,
                "step_wall_us": totals["step_wall_ns"] / totals["intervals"] / 1e3,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
