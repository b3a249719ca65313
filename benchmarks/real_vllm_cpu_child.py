"""Our CPU time per model step inside the real vLLM engine; run by ``bench_real_vllm.py`` in ``.venv-vllm``.

Usage: ``python real_vllm_cpu_child.py SCENARIO.json ROUNDS`` with ``DUMP_ON=1`` and the shim on
PYTHONPATH (the hooks come from the environment, as in any job). ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
keeps the engine core and its worker in this process, so this benchmark-only script can time the
patch's per-step work from outside the library: it replaces the patch module's ``_record_step``
(everything the ``_update_states`` wrapper does after vLLM's own call) with a timed call of it, and
takes the time between two steps' calls as the step's: its wall time, and its CPU time on the thread
that runs the model (which includes that thread's share of the OpenMP regions, spin-waits too). The
timer itself costs several microseconds a step (two reads of the thread's CPU clock, the wrapper): it is
first run around nothing at the same place for a third of the rounds (no line written then), and its mean
taken off ours. The dispatch log's lines are built and written by our writer thread, off the step: its CPU
time is timed the same way (around each of its writes) and reported apart.
Prints one JSON line: steps, rows a step, and microseconds per step of each.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
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
    totals = {"writer_ns": 0, "intervals": 0, "step_ns": 0, "step_wall_ns": 0}
    last_call = [0, 0]  # thread CPU and wall time at the last call; 0 at a generation's start
    # Per step: the CPU time inside the timer, the rows, the new requests. The timer's own cost (two reads of the
    # thread's CPU clock, a system call each, and this wrapper's Python, cold after the model's kernels as ours is)
    # is measured apart, around nothing at the same place, and taken off.
    measured: list[tuple[int, int, int]] = []
    timer_alone: list[tuple[int, int, int]] = []

    from msprobe_hooks.patching import argument

    def timed(work, into):
        def timed_record_step(ctx, runner, state, args, kwargs):
            began, wall = time.thread_time_ns(), time.perf_counter_ns()
            if last_call[0]:
                totals["intervals"] += 1
                totals["step_ns"] += began - last_call[0]
                totals["step_wall_ns"] += wall - last_call[1]
            last_call[:] = began, wall
            try:
                return work(ctx, runner, state, args, kwargs)
            finally:
                inside = time.thread_time_ns() - began
                output = argument(args, kwargs, "scheduler_output", 0)
                into.append((inside, len(output.num_scheduled_tokens), len(output.scheduled_new_reqs)))

        return timed_record_step

    from msprobe_hooks import jsonl

    drain = jsonl._Writer.drain

    def timed_drain(writer):
        began = time.thread_time_ns()
        try:
            return drain(writer)
        finally:
            totals["writer_ns"] += time.thread_time_ns() - began

    def run(rounds: int) -> None:
        for _ in range(rounds):
            generate(llm.llm_engine, scenario["waves"])
            last_call[:] = 0, 0  # the gap between two generations is no step

    generate(llm.llm_engine, scenario["waves"])  # warm-up
    jsonl.flush()
    patch._record_step = timed(lambda *_: None, timer_alone)
    run(max(3, rounds // 3))  # nothing recorded: the timer alone
    totals.update(intervals=0, step_ns=0, step_wall_ns=0)
    jsonl._Writer.drain = timed_drain
    patch._record_step = timed(record_step, measured)
    run(rounds)
    jsonl.flush()
    calls = len(measured)
    timer = statistics.mean(inside for inside, _, _ in timer_alone)
    timer_median = statistics.median(inside for inside, _, _ in timer_alone)
    running = [inside for inside, _, new in measured if not new]
    bringing = [inside - timer for inside, _, new in measured if new]
    new_requests = sum(new for _, _, new in measured)
    print(
        "CPU "
        + json.dumps(
            {
                "steps": calls,
                "rows_per_step": sum(rows for _, rows, _ in measured) / calls,
                "ours_us": (statistics.mean(inside for inside, _, _ in measured) - timer) / 1e3,
                "timer_us": timer / 1e3,  # taken off ours_us
                "writer_us": totals["writer_ns"] / calls / 1e3,
                "step_us": totals["step_ns"] / totals["intervals"] / 1e3,
                "step_wall_us": totals["step_wall_ns"] / totals["intervals"] / 1e3,
                # apart: a step whose requests all ran before (decode), and one that brings new requests
                "running_median_us": (statistics.median(running) - timer_median) / 1e3 if running else None,
                "new_steps": len(bringing),
                "new_step_us": statistics.mean(bringing) / 1e3 if bringing else None,
                "new_request_us": sum(bringing) / new_requests / 1e3 if new_requests else None,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
