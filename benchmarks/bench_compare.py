"""``msprobe-hooks compare`` against ``msprobe compare --consistent_check``, per pair, on the same real pairs.

    python benchmarks/bench_compare.py [PAIRS_FILE]

Without a pairs file, real pairs are made first (verl's FSDP2 engine and vLLM's CPU engine, four
prompts, as tests/test_compare.py makes them; about a minute). Timed, wall clock, each a fresh
process as a user runs it: our CLI over all pairs (one process, ``--jobs 1`` so the ratio is not
a core count) divided by the number of pairs, and msprobe's CLI once per pair (it takes one pair
per call); our CLI again over the pairs repeated ten times (start-up shared, as in a real job).
Also the in-process time per pair (no interpreter start-up or imports). Prints
seconds and the ratio; no pass/fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MANY = 10


def _make_pairs(folder: Path) -> Path:
    sys.path[:0] = [str(REPO / "tests")]
    import compare_runs

    model, _ = compare_runs.build_models(folder)
    prompts = compare_runs.write_prompts(folder / "prompts.jsonl")
    config = compare_runs.msprobe_config(folder / "config.json")
    train = compare_runs.run_training(folder / "train", model, prompts, config)
    generate = compare_runs.run_vllm(folder / "generate", model, prompts, config)
    compare_runs.write_pairs(train, generate, folder / "pairs.jsonl")
    return folder / "pairs.jsonl"


def _timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, cwd=REPO)
    return time.perf_counter() - start


def _ours(pairs_file: Path, out: Path) -> float:
    return _timed([str(BIN / "msprobe-hooks"), "compare", str(pairs_file), "-o", str(out), "--jobs", "1"])


def main() -> int:
    from msprobe_hooks.analysis import compare, pairs

    folder = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    try:
        pairs_file = Path(sys.argv[1]) if len(sys.argv) > 1 else _make_pairs(folder)
        pair_list = list(pairs.read(str(pairs_file)))
        n = len(pair_list)
        ours = _ours(pairs_file, folder / "ours")
        # A job has many pairs: the same pairs ten times over shows the per-pair cost once start-up is shared.
        many = folder / "many.jsonl"
        pairs.write([{**p, "pair": i} for i, p in enumerate(pair_list * MANY)], str(many))
        ours_many = _ours(many, folder / "many")
        start = time.perf_counter()
        for i, pair in enumerate(pair_list):
            compare.compare_pair(i, pair, compare.DEFAULT_THRESHOLD)
        in_process = (time.perf_counter() - start) / n
        theirs = 0.0
        for i, pair in enumerate(pair_list):
            out = folder / f"msprobe{i}"
            out.mkdir()
            theirs += _timed(
                [str(BIN / "msprobe"), "compare", "-tp", pair["train"]["dump"], "-gp", pair["generate"]["dump"],
                 "-o", str(out), "--consistent_check", "--backend", "fsdp"]
            )  # fmt: skip
        print(f"{n} real pairs (verl FSDP2 vs vLLM CPU, statistics L0), {os.cpu_count()} cores")
        print(f"  msprobe compare --consistent_check: {theirs / n:.3f} s per pair (one process per pair)")
        print(f"  msprobe-hooks compare --jobs 1:     {ours / n:.3f} s per pair (one process for all pairs)")
        print(f"  msprobe-hooks compare --jobs 1:     {ours_many / n / MANY:.3f} s per pair ({n * MANY} pairs)")
        print(f"  msprobe-hooks, in process:          {in_process * 1000:.1f} ms per pair (no start-up, no report)")
        cli, cli_many, direct = theirs / ours, theirs * MANY / ours_many, theirs / n / in_process
        print(
            f"  ratio msprobe / msprobe-hooks per pair: {cli:.1f}x (CLI, {n} pairs), {cli_many:.1f}x (CLI, "
            f"{n * MANY} pairs), {direct:.0f}x (in process)"
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
