"""A long run (issue 20, item 5): ``align`` and ``compare`` over 100 global steps x 10 pairs, memory flat in steps.

    python benchmarks/bench_run_scale.py

The run is built from the golden FSDP2 and vLLM trees (real dumps of a 2-layer model, two prompts): per
global step g, five copies of each prompt under request ids of their own (``g{g}-c{k}-req-i``), each
rollout before its training step in time, every dump a hard link of the golden one. Timed, wall clock,
each command in a fresh process as a user runs it (compare with its default jobs), at 10 and at 100
steps side by side, with each command's peak memory: what stays flat is the per-step cost and the
memory. No pass/fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"
COPIES = 5  # x 2 golden prompts: 10 pairs a step
STEPS = (10, 20, 50, 100)  # past 20 steps (200 pairs) the page shows no more pairs: memory flat from there


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _link_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target, copy_function=os.link)


def build(root: Path, steps: int) -> tuple[Path, Path]:
    """(training root, generate root) of ``steps`` global steps of ``2 * COPIES`` prompts each."""
    (train_log,) = (GOLDEN / "fsdp2" / "actor").glob("*/update_actor_log.jsonl")
    (gen_log,) = (GOLDEN / "vllm" / "generate").glob("*/dispatch_log.jsonl")
    train_lines, gen_lines = _lines(train_log), _lines(gen_log)
    train, generate = root / "actor", root / "generate"
    (train / "1").mkdir(parents=True)
    (generate / "2").mkdir(parents=True)
    out_train, out_gen = [], []
    train_step = gen_step = 0
    for g in range(1, steps + 1):
        for copy in range(COPIES):
            tag = f"g{g}-c{copy}-"
            for line in gen_lines:
                _link_tree(gen_log.parent / f"step{line['step']}", generate / "2" / f"step{gen_step}")
                record = json.loads(json.dumps(line))
                record.update(step=gen_step, pid=2, time=1000.0 * g + gen_step * 1e-3)
                for row in record["requests"]:
                    row["request_id"], row["request_id_base"] = tag + row["request_id"], tag + row["request_id_base"]
                out_gen.append(record)
                gen_step += 1
        for copy in range(COPIES):
            tag = f"g{g}-c{copy}-"
            for line in train_lines:
                _link_tree(train_log.parent.parent / f"step{line['step']}", train / f"step{train_step}")
                record = json.loads(json.dumps(line))
                record.update(step=train_step, pid=1, global_step=g, time=1000.0 * g + 500 + train_step * 1e-3)
                for sample in record["samples"]:
                    sample["request_id"] = tag + sample["request_id"]
                    sample["request_ids"] = [sample["request_id"]]
                record["request_ids"] = [s["request_id"] for s in record["samples"]]
                out_train.append(record)
                train_step += 1
    (train / "1" / train_log.name).write_text("".join(json.dumps(r) + "\n" for r in out_train))
    (generate / "2" / gen_log.name).write_text("".join(json.dumps(r) + "\n" for r in out_gen))
    return train, generate


def _timed(command: list[str]) -> tuple[float, float]:
    """Wall seconds and the peak resident memory (MB, GNU time's) of ``command``, a fresh process."""
    start = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", *command], check=True, capture_output=True, text=True, cwd=REPO)
    return time.perf_counter() - start, int(done.stderr.strip().splitlines()[-1]) / 1024


def main() -> int:
    cli = [sys.executable, "-m", "msprobe_hooks"]
    print(f"{2 * COPIES} pairs a global step, golden 2-layer dumps, {os.cpu_count()} cores")
    header = ("steps", 5), ("pairs", 6), ("align s", 8), ("per step", 9), ("MB", 5), ("compare s", 10), ("per step", 9)
    print("  " + " ".join(f"{name:>{width}}" for name, width in header) + f" {'MB':>5}")
    for steps in STEPS:
        folder = Path(tempfile.mkdtemp(prefix="bench-run-"))
        try:
            train, generate = build(folder, steps)
            pairs_file = folder / "pairs.jsonl"
            aligned, align_peak = _timed([*cli, "align", str(train), str(generate), "-o", str(pairs_file)])
            compared, compare_peak = _timed([*cli, "compare", str(pairs_file), "-o", str(folder / "report")])
            count = sum(1 for _ in pairs_file.open())
            print(
                f"  {steps:>5} {count:>6} {aligned:>8.2f} {aligned / steps:>9.3f} {align_peak:>5.0f} {compared:>10.2f} "
                f"{compared / steps:>9.3f} {compare_peak:>5.0f}"
            )
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    print("  (MB: each command's peak resident memory; target: 100 steps in <= 60 s, memory flat in steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
