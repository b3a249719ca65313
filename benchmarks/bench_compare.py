"""``msprobe-hooks compare`` against ``msprobe compare --consistent_check``, per pair, on the same real pairs.

    python benchmarks/bench_compare.py [PAIRS_FILE]

The pairs are real: the golden verdict set's (``synthetic_dumps.real_pairs``: verl's FSDP2 engine against
vLLM's CPU engine, 36 pairs of 9 cases), or those of ``PAIRS_FILE``. Timed, wall clock, each a fresh process
as a user runs it (interpreter start-up, imports and the whole report included): our CLI over 5 pairs and
over 100 (the real pairs repeated), with ``--jobs 1`` and with the default (all cores: a process pool from
``pool.PAIRS_PER_PROCESS`` pairs a worker, the figures' process beside it), each the median of
:data:`REPEATS`, divided by the number of pairs; msprobe's CLI once per pair on the 5 pairs (it takes one
pair per call, so its cost per pair does not depend on how many there are). Also the time per pair in
process (no start-up, no report), and the peak memory of reading one dump.json of ~100 and ~200 MB (a real
inference dump with its layers repeated) against ``json.load``: the reader alone (flat in the dump's size), and
compare's reading of a side (it keeps every tensor packed, ``comparing/side_tensors.py``, so it grows with the
tensors: here, where only layers are repeated, with the size), with its bytes per tensor. Prints seconds, ratios
and the load average; no pass/fail.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from synthetic_dumps import deeper, real_pairs, renumbered

from msprobe_hooks.analysis.answer.verdict import rules
from msprobe_hooks.analysis.one_pair import judged_pair
from msprobe_hooks.analysis.pairing import pairs
from msprobe_hooks.analysis.results import DEFAULT_THRESHOLD

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
FEW, MANY = 5, 100
REPEATS = 3
LARGE_MB = (100, 200)  # two sizes: what stays flat as the dump grows, and what does not


def _timed(command: list[str], check: bool = True) -> tuple[float, int]:
    """Wall-clock seconds and exit status of ``command``."""
    start = time.perf_counter()
    done = subprocess.run(command, check=check, capture_output=True, cwd=REPO)
    return time.perf_counter() - start, done.returncode


def _peak_mb(code: str) -> tuple[float, list[str]]:
    """Peak resident memory of a fresh interpreter running ``code``, in MB, and what ``code`` printed."""
    probe = f"import resource\n{code}\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    done = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd=REPO)
    *printed, peak = done.stdout.split()
    return int(peak) / 1024, printed


def _memory(template: str, folder: Path) -> None:
    """Peak memory above the imports at each of :data:`LARGE_MB`: json.load, the reader alone, compare's side."""
    per_layer = 10 * 2**10  # about what one decoder layer of the real dump takes; checked against the size below
    imports = "\n".join(
        [
            "import json",
            "from msprobe_hooks.analysis import dumpfile",
            "from msprobe_hooks.analysis.comparing import compare, names",
        ]
    )
    base = _peak_mb(imports)[0]
    print(f"  peak memory reading a dump.json (real, its layers repeated), above the imports ({base:.0f} MB):")
    for megabytes in LARGE_MB:
        path = folder / f"large{megabytes}.json"
        deeper(template, path, megabytes * 2**20 // per_layer)
        size = path.stat().st_size / 2**20
        whole = _peak_mb(f"{imports}\njson.load(open({str(path)!r}))")[0] - base
        reader = _peak_mb(f"{imports}\nfor _ in dumpfile.entries({str(path)!r}): pass")[0] - base
        peak, (tensors, rows) = _peak_mb(
            f"{imports}\nside = compare.read_side({str(path)!r}, names.load())\n"
            "print(len(side.tensors), len(side.not_comparable))"
        )
        side = peak - base
        per_tensor = side * 2**20 / (int(tensors) + int(rows))
        print(
            f"    {size:.0f} MB: json.load {whole:.0f} MB; the reader (dumpfile.entries) {reader:.0f} MB; compare's "
            f"read_side {side:.0f} MB ({side / whole:.2f}x json.load), holding {tensors} module tensors' statistics "
            f"and {rows} not-comparable tensors ({per_tensor:.0f} bytes a tensor)"
        )
        path.unlink()


def _ours(pairs_file: Path, out: Path, jobs: list[str]) -> float:
    """The median wall time of our CLI over every pair of ``pairs_file``."""
    command = [str(BIN / "msprobe-hooks"), "compare", str(pairs_file), "-o", str(out), *jobs]
    return statistics.median(_timed(command)[0] for _ in range(REPEATS))


def _theirs(pair_list: list[pairs.Pair], folder: Path) -> tuple[float, int]:
    """msprobe's CLI once per pair: the mean seconds per pair, and on how many it failed."""
    total, failed = 0.0, 0
    for i, pair in enumerate(pair_list):
        out = folder / f"msprobe{i}"
        out.mkdir()
        seconds, status = _timed(
            [str(BIN / "msprobe"), "compare", "-tp", pair.train.dump, "-gp", pair.generate.dump,
             "-o", str(out), "--consistent_check", "--backend", "fsdp"],
            check=False,  # it raises on level mix ("Conflicting comparison data"): timed all the same
        )  # fmt: skip
        total += seconds
        failed += status != 0
    return total / len(pair_list), failed


def main() -> int:
    folder = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    try:
        given = list(pairs.read(sys.argv[1])) if len(sys.argv) > 1 else real_pairs(folder)
        few, many = renumbered(given, FEW), renumbered(given, MANY)
        start = time.perf_counter()
        for i, pair in enumerate(few):
            judged_pair(i, pair, rules(DEFAULT_THRESHOLD))
        in_process = (time.perf_counter() - start) / len(few)
        load = os.getloadavg()[0]
        theirs, failed = _theirs(few, folder)
        ours = {}
        for name, pair_list in (("few", few), ("many", many)):
            pairs_file = folder / f"{name}.jsonl"
            pairs.write(pair_list, str(pairs_file))
            for jobs in ("1", None):
                out = folder / f"{name}-{jobs}"
                ours[name, jobs] = _ours(pairs_file, out, ["--jobs", jobs] if jobs else []) / len(pair_list)
        print(
            f"{len(given)} real pairs (verl FSDP2 vs vLLM CPU, 4 layers), {os.cpu_count()} cores, "
            f"load average {load:.2f} before / {os.getloadavg()[0]:.2f} after; median of {REPEATS} runs"
        )
        print(
            f"  msprobe compare --consistent_check: {theirs:.3f} s per pair (one process per pair, {FEW} pairs; "
            f"failed on {failed})"
        )
        print(f"  {'msprobe-hooks compare':<34} {'s per pair':>10} {'msprobe / ours':>15}")
        for (name, jobs), seconds in ours.items():
            label = f"{FEW if name == 'few' else MANY} pairs, --jobs {jobs or f'{os.cpu_count()} (default)'}"
            print(f"  {label:<34} {seconds:>10.3f} {theirs / seconds:>14.1f}x")
        print(f"  {'in process (no start-up, no report)':<34} {in_process:>10.4f} {theirs / in_process:>14.0f}x")
        _memory(given[0].generate.dump, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
