"""Interpreter start-up cost of the shim: off (DUMP_ON unset) and on (no target imported).

Measured in a regular install, as users get it (an editable install adds its own import finder to
every process): the wheel of this checkout in a fresh venv made here, without dependencies (start-up
needs none). Wall-clock medians of many interleaved ``python -c pass`` runs, plus ``-X importtime``'s
own count of the sitecustomize import, which is not blurred by process start-up noise.
Targets: off <= 1 ms above plain Python; on <= 5 ms above it and no torch/target import.

    python benchmarks/bench_startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("torch", "msprobe", "verl", "vllm", "sglang", "ray")
REPO = Path(__file__).resolve().parents[1]


def regular_install(folder: Path) -> tuple[str, str]:
    """(python, shim folder) of a fresh venv holding this checkout's wheel, installed without dependencies."""
    wheels = folder / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)],
        check=True,
    )
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", *map(str, wheels.glob("*.whl"))], check=True)
    shim = subprocess.run(
        [python, "-c", "from msprobe_hooks.cli.launch import shim_dir; print(shim_dir())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return python, shim.stdout.strip()


PYTHON = sys.executable  # replaced by the regular install's in main()
SHIM = ""


def environment(shim: bool, dump_on: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUMP_", "MSPROBE_", "PROMPTS_ONLY"))}
    env.pop("PYTHONPATH", None)
    # Measure what users get: bytecode cached (pip compiles on install; the first run here writes it).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if shim:
        env["PYTHONPATH"] = SHIM
    if dump_on:
        env["DUMP_ON"] = "1"
    return env


def cases() -> dict[str, dict[str, str]]:
    return {
        "plain python": environment(shim=False, dump_on=False),
        "shim, DUMP_ON unset": environment(shim=True, dump_on=False),
        "shim, DUMP_ON=1": environment(shim=True, dump_on=True),
    }


def wall_ms(env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([PYTHON, "-c", "pass"], env=env, check=True)
    return (time.perf_counter() - start) * 1000


def sitecustomize_import_us(env: dict[str, str]) -> int:
    """Cumulative microseconds of the outermost sitecustomize import, as -X importtime reports it.

    The shim's chained import of the next sitecustomize is listed too (nested, so printed first).
    """
    done = subprocess.run([PYTHON, "-X", "importtime", "-c", "pass"], env=env, capture_output=True, text=True)
    times = [
        int(match.group(1))
        for line in done.stderr.splitlines()
        if (match := re.match(r"import time:\s+\d+\s+\|\s+(\d+)\s+\|\s*sitecustomize$", line))
    ]
    return max(times, default=0)


def heavy_imports(env: dict[str, str]) -> list[str]:
    code = f"import json, sys; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    done = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def measure(runs: int) -> dict[str, dict[str, float]]:
    CASES = cases()
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for env in CASES.values():  # warm the file cache
        wall_ms(env)
    for _ in range(runs):
        for name, env in CASES.items():  # interleaved, so drift hits every case alike
            samples[name].append(wall_ms(env))
    importtime = {
        name: statistics.median(sitecustomize_import_us(env) for _ in range(max(5, runs // 4)))
        for name, env in CASES.items()
    }
    return {
        name: {"median_ms": statistics.median(values), "min_ms": min(values), "sitecustomize_us": importtime[name]}
        for name, values in samples.items()
    }


def report(runs: int) -> list[str]:
    results = measure(runs)
    base = results["plain python"]
    lines = [f"start-up ({runs} interleaved runs each; median / min wall time; sitecustomize import per -X importtime)"]
    for name, values in results.items():
        delta = values["median_ms"] - base["median_ms"]
        lines.append(
            f"  {name:<22} {values['median_ms']:7.2f} ms / {values['min_ms']:6.2f} ms   "
            f"x{values['median_ms'] / base['median_ms']:.3f}  {delta:+6.2f} ms   "
            f"sitecustomize {values['sitecustomize_us'] / 1000:6.2f} ms"
        )
    heavy = heavy_imports(cases()["shim, DUMP_ON=1"])
    imported = ", ".join(heavy) if heavy else "none of " + ", ".join(HEAVY)
    lines.append(f"  imported at start-up with DUMP_ON=1: {imported}")
    lines.append("  targets: off <= 1 ms above plain python; on <= 5 ms above it, nothing heavy imported")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=60)
    args = parser.parse_args()
    global PYTHON, SHIM
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as folder:
        PYTHON, SHIM = regular_install(Path(folder))
        print("\n".join(report(args.runs)))


if __name__ == "__main__":
    main()
