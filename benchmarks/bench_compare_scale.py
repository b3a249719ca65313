"""``msprobe-hooks compare`` on 1,000 pairs of a 28-layer model, with the process pool (issue 22: <= 60 s on 2 cores).

    python benchmarks/bench_compare_scale.py [PAIRS]

The pairs are built from real ones: the golden verdict set's 36 pairs (verl FSDP2 against vLLM CPU, 4 layers,
clean and with one weight scaled), each dump's decoder layers repeated to 28 (``synthetic_dumps.deeper``), the
36 repeated to 1,000. Timed: the CLI as a user runs it (default jobs: every core), wall clock, with its peak
memory (the largest process: ``ru_maxrss`` of the command's children), and the report's size; beside it the
time per pair in process (reading both dumps and comparing, no report), and what that makes per core. Prints
seconds and MB, and the load average; no pass/fail.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from synthetic_dumps import deeper_pairs, real_pairs, renumbered

from msprobe_hooks.analysis.answer.verdict import rules
from msprobe_hooks.analysis.one_pair import judged_pair
from msprobe_hooks.analysis.pairing import pairs
from msprobe_hooks.analysis.results import DEFAULT_THRESHOLD

BIN = Path(sys.executable).parent
LAYERS = 28
PAIRS = 1000
SAMPLE = 36  # pairs timed in process


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else PAIRS
    folder = Path(tempfile.mkdtemp(prefix="bench-compare-scale-"))
    try:
        deep = deeper_pairs(real_pairs(folder), folder / "dumps", LAYERS)
        pairs_file = folder / "pairs.jsonl"
        pairs.write(renumbered(deep, count), str(pairs_file))
        start = time.perf_counter()
        rows = sum(len(judged_pair(i, p, rules(DEFAULT_THRESHOLD))[1]) for i, p in enumerate(deep[:SAMPLE]))
        per_pair = (time.perf_counter() - start) / SAMPLE
        load = os.getloadavg()[0]
        out = folder / "report"
        start = time.perf_counter()
        done = subprocess.run(
            [str(BIN / "msprobe-hooks"), "compare", str(pairs_file), "-o", str(out)], capture_output=True, text=True
        )
        wall = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
        sizes = {f.name: f.stat().st_size / 1e6 for f in sorted(out.iterdir())}
        cores = os.cpu_count() or 1
        print(
            f"{count} pairs of a {LAYERS}-layer model ({rows // SAMPLE} rows a pair), {cores} cores, "
            f"load average {load:.2f} before / {os.getloadavg()[0]:.2f} after"
        )
        print(f"  msprobe-hooks compare (default jobs: {cores}): {wall:.1f} s, {wall / count * 1000:.1f} ms per pair")
        print(f"  peak memory of its largest process: {peak:.0f} MB")
        print(
            f"  in process: {per_pair * 1000:.1f} ms per pair (read both dumps, compare; no report): "
            f"{per_pair * count / cores:.1f} s for {count} pairs on {cores} cores"
        )
        print("  report: " + ", ".join(f"{name} {mb:.1f} MB" for name, mb in sizes.items()))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
