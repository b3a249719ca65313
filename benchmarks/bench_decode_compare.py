"""Decode pairs (issue 19): compare's cost per response token, and its memory (tensor mode, one tensor pair at a time).

    python benchmarks/bench_decode_compare.py [PAIRS_FILE]

Without a pairs file, the CPU kit's RL loop runs once (real vLLM and verl FSDP2 engines, the demo's
model and four prompts, tensor mode, ``DUMP_SEQUENCES=1``, about a minute) and is aligned. Timed in
this process (no start-up): ``compare_pair`` per prefill pair and per decode pair, median of three,
with the tensor files each reads; and the peak memory of a fresh process comparing the largest decode
pair against that of one importing the same modules, beside the size of the two dumps' tensor files
(the comparison holds one tensor pair at a time, never a dump). No pass/fail.
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

REPO = Path(__file__).resolve().parent.parent
REPEATS = 3


def _make_pairs(folder: Path) -> Path:
    sys.path[:0] = [str(REPO), str(REPO / "tests")]
    from support.compare_runs import msprobe_config
    from support.rl_loop import run_loop

    from cpu_kit import demo_inputs

    demo_inputs.build_models(folder / "inputs")
    demo_inputs.write_prompts(folder / "inputs" / "prompts.jsonl")
    tensor = msprobe_config(folder / "tensor.json", task="tensor")
    run = run_loop(
        folder / "loop",
        folder / "inputs",
        "--iterations",
        "1",
        DUMP_SEQUENCES="1",
        MSPROBE_ACTOR_CONFIG=tensor,
        MSPROBE_GENERATE_CONFIG=tensor,
    )
    pairs_file = folder / "pairs.jsonl"
    command = [sys.executable, "-m", "msprobe_hooks", "align", str(run.train_root), str(run.generate_root)]
    subprocess.run([*command, "-o", str(pairs_file)], check=True, capture_output=True)
    return pairs_file


def _tensor_bytes(dump: str) -> int:
    folder = Path(dump).parent / "dump_tensor_data"
    return sum(f.stat().st_size for f in folder.iterdir()) if folder.is_dir() else 0


def _peak_mb(code: str) -> float:
    probe = f"import resource\n{code}\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    done = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd=REPO)
    return int(done.stdout.split()[-1]) / 1024


def main() -> int:
    from msprobe_hooks.analysis.answer.verdict import rules
    from msprobe_hooks.analysis.one_pair import judged_pair
    from msprobe_hooks.analysis.pairing import pairs
    from msprobe_hooks.analysis.results import DEFAULT_THRESHOLD

    folder = Path(tempfile.mkdtemp(prefix="bench-decode-"))
    try:
        pairs_file = Path(sys.argv[1]) if len(sys.argv) > 1 else _make_pairs(folder)
        found = list(pairs.read(str(pairs_file)))
        seconds: dict[str, list[float]] = {"prefill": [], "decode": []}
        for i, pair in enumerate(found):
            runs = []
            for _ in range(REPEATS):
                start = time.perf_counter()
                judged_pair(i, pair, rules(DEFAULT_THRESHOLD))
                runs.append(time.perf_counter() - start)
            seconds[pair.kind].append(statistics.median(runs))
        print(f"{len(found)} pairs (tensor mode, verl FSDP2 vs vLLM CPU, 4 layers hidden 128), {os.cpu_count()} cores")
        for kind, values in seconds.items():
            if values:
                print(f"  {kind:>7}: {statistics.median(values) * 1000:7.1f} ms per pair (median of {len(values)})")
        decode = [p for p in found if p.kind == "decode"]
        if decode:
            largest = max(decode, key=lambda p: _tensor_bytes(p.train.dump) + _tensor_bytes(p.generate.dump))
            files = (_tensor_bytes(largest.train.dump) + _tensor_bytes(largest.generate.dump)) / 2**20
            index = found.index(largest)
            imports = (
                "from msprobe_hooks.analysis.one_pair import judged_pair\n"
                "from msprobe_hooks.analysis.answer.verdict import rules\n"
                "from msprobe_hooks.analysis.pairing import pairs\nimport torch"
            )
            run = f"p = list(pairs.read({str(pairs_file)!r}))[{index}]\njudged_pair(0, p, rules(0.02))"
            base, peak = _peak_mb(imports), _peak_mb(f"{imports}\n{run}")
            print(
                f"  one decode pair: {peak - base:.1f} MB above the imports ({base:.0f} MB), its two dumps' tensor "
                f"files {files:.1f} MB"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
