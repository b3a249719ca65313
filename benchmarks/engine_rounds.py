"""Generation rounds in long-lived real-engine processes, interleaved (bench_real_vllm, bench_real_sglang).

Each child (``tests/support/real_*_child.py`` in serve mode) prints ``SERVE ready`` once its engine is up,
then runs one generation per ``go`` line and prints ``SERVE <wall seconds>``. Every round asks each
child once, in rotating order, so that load from elsewhere on the machine falls on all alike.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.engine_serve import SERVE  # noqa: E402  (the children's protocol, one definition)


def _answer(child: subprocess.Popen) -> str:
    for line in child.stdout:
        if line.startswith(SERVE + " "):
            return line.split(" ", 1)[1].strip()
    raise RuntimeError(f"the engine child exited ({child.wait()}) before answering")


def run_rounds(children: Mapping[str, subprocess.Popen], warmup: int, rounds: int) -> dict[str, list[float]]:
    """Wall seconds of each child's generations after ``warmup`` rounds, by child name."""
    for child in children.values():
        assert _answer(child) == "ready"
    times: dict[str, list[float]] = {name: [] for name in children}
    names = list(children)
    for index in range(warmup + rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            children[name].stdin.write("go\n")
            children[name].stdin.flush()
            elapsed = float(_answer(children[name]))
            if index >= warmup:
                times[name].append(elapsed)
    return times


def close(children: Mapping[str, subprocess.Popen]) -> None:
    for child in children.values():
        child.stdin.close()
        child.wait(timeout=120)


def report(title: str, times: Mapping[str, list[float]], lines: int) -> None:
    """Medians per child (``off-N``: DUMP_ON unset, ``log-N``: the dispatch log only), the ratio, the noise floor."""
    print(title)
    for name, samples in times.items():
        kind = "DUMP_ON unset" if name.startswith("off") else "DUMP_ON=1, dispatch log only"
        print(f"  {name}  {kind:<29} {statistics.median(samples) * 1e3:8.1f} ms per generation (median)")
    kinds = {kind: [t for name, ts in times.items() if name.startswith(kind) for t in ts] for kind in ("off", "log")}
    off, log = statistics.median(kinds["off"]), statistics.median(kinds["log"])
    floor = statistics.median(times["off-1"]) / statistics.median(times["off-0"])
    print(f"  ratio log/off: {log / off:.3f} (target <= 1.02); off-1/off-0: {floor:.3f} (noise floor)")
    print(f"  {lines} dispatch-log lines written")
