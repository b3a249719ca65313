"""A real-size model through the whole loop: Qwen2.5-0.5B's shape, random weights, on this CPU.

    python benchmarks/bench_real_size.py [--prompts N] [--prompt-len T] [--layers L] [--keep DIR]

A random checkpoint of Qwen2.5-0.5B's shape (``cpu_kit.demo_inputs.QWEN2_5_0_5B``: 24 layers, hidden 896,
14 heads, 2 KV heads, MLP 4864, vocabulary 151,936; bfloat16 on disk, made here, nothing downloaded) goes
through the loop a user runs: verl's FSDP2 engine (``examples/cpu_demo.py --log-prob-only``, fp32, statistics
L0, ``PROMPTS_ONLY=1``), vLLM's CPU engine (``examples/vllm_generate.py``, fp32), ``msprobe-hooks align``, then
``compare``. Prints per side the wall time of the run and the dump size per pair; for compare, the wall time
of the command over all pairs (``--jobs 1``, one process as a user runs it) divided by the pairs, the time
per pair in one process (after the imports), and the peak memory (RSS) of compare on one pair in a process
of its own. Targets (issue 22): compare <= 1 s and <= 300 MB per pair. No pass/fail. ``--layers`` makes
a smaller variant (``tests/analysis/test_real_size.py`` runs one).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # cpu_kit, support

from support import compare_runs  # noqa: E402

from cpu_kit import verl_cpu  # noqa: E402
from cpu_kit.demo_inputs import QWEN2_5_0_5B  # noqa: E402


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _timed(what, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    result = what(*args, **kwargs)
    return time.perf_counter() - start, result


def _peak_rss_mb(command: list[str]) -> float:
    """Peak resident memory of ``command`` run as a child (Linux: ru_maxrss in KiB)."""
    script = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    done = subprocess.run([sys.executable, "-c", script, *command], check=True, capture_output=True, text=True)
    return int(done.stdout.split()[-1]) / 1024


def run(work: Path, prompts: int, prompt_len: int, layers: int) -> dict:
    """The loop on ``work``; the numbers it prints, as a dict."""
    shape = {**QWEN2_5_0_5B, "layers": layers}
    import torch

    built, model = _timed(verl_cpu.build_model_dir, os.fspath(work / "model"), dtype=torch.bfloat16, **shape)
    model = Path(model)  # type: ignore[arg-type]
    rng = random.Random(0)
    lines = [
        json.dumps(
            {
                "request_id": f"req-{i}",
                "prompt_token_ids": [rng.randrange(3, shape["vocab"]) for _ in range(prompt_len)],
            }
        )
        for i in range(prompts)
    ]
    (work / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    config = compare_runs.msprobe_config(work / "statistics.json")
    train_s, train = _timed(
        compare_runs.run_training, work / "train", model, work / "prompts.jsonl", config, extra=["--log-prob-only"]
    )
    vllm_s, generate = _timed(compare_runs.run_vllm, work / "vllm", model, work / "prompts.jsonl", config)
    pairs_file = work / "pairs.jsonl"
    align_s, found = _timed(compare_runs.align, train, generate, pairs_file)
    n = len(found)
    train_dumps = [Path(p["train"]["dump"]) for p in compare_runs.raw_pairs(pairs_file)]
    generate_dumps = [Path(p["generate"]["dump"]) for p in compare_runs.raw_pairs(pairs_file)]
    report = work / "report"
    command = [sys.executable, "-m", "msprobe_hooks", "compare", os.fspath(pairs_file), "-o", os.fspath(report)]
    cli_s, _ = _timed(subprocess.run, [*command, "--jobs", "1"], check=True, capture_output=True)
    one = work / "one.jsonl"
    one.write_text(pairs_file.read_text().splitlines()[0] + "\n")
    rss = _peak_rss_mb(
        [sys.executable, "-m", "msprobe_hooks", "compare", os.fspath(one), "-o", os.fspath(work / "r1"), "--jobs", "1"]
    )
    from msprobe_hooks.analysis.answer.verdict import rules
    from msprobe_hooks.analysis.one_pair import judged_pair
    from msprobe_hooks.analysis.pairing import pairs

    per_pair = []
    for index, pair in enumerate(pairs.read(os.fspath(pairs_file))):
        seconds, (result, _) = _timed(judged_pair, index, pair, rules(0.02))
        per_pair.append(seconds)
    return {
        "model": f"{layers} layers, hidden {shape['hidden']}, vocabulary {shape['vocab']} (bf16 on disk: "
        f"{_size(model) / 1e9:.2f} GB, built in {built:.0f} s)",
        "pairs": n,
        "training": (train_s, statistics.median(d.stat().st_size for d in train_dumps)),
        "vllm": (vllm_s, statistics.median(d.stat().st_size for d in generate_dumps)),
        "align_s": align_s,
        "compare_cli_per_pair_s": cli_s / n,
        "compare_in_process_per_pair_s": statistics.median(per_pair),
        "compare_one_pair_peak_rss_mb": rss,
        "compared": result.compared,
        "verdict": str(result.verdict),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--layers", type=int, default=QWEN2_5_0_5B["layers"])
    parser.add_argument("--keep", help="a folder to work in and keep (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-real-size-") as folder:
        work = Path(args.keep or folder)
        work.mkdir(parents=True, exist_ok=True)
        found = run(work, args.prompts, args.prompt_len, args.layers)
    print(f"model: {found['model']}; {found['pairs']} pairs of {args.prompt_len}-token prompts, statistics L0, fp32")
    for side in ("training", "vllm"):
        seconds, size = found[side]
        name = "verl FSDP2 (cpu_demo.py --log-prob-only)" if side == "training" else "vLLM (vllm_generate.py)"
        print(f"  {name:<42} wall {seconds:6.1f} s   dump.json per pair (median) {size / 1e6:6.2f} MB")
    print(f"  align                                      wall {found['align_s']:6.2f} s")
    print(
        f"  compare, per pair: {found['compare_cli_per_pair_s']:.2f} s (the command, --jobs 1, start-up included), "
        f"{found['compare_in_process_per_pair_s']:.3f} s (in process); peak RSS on one pair "
        f"{found['compare_one_pair_peak_rss_mb']:.0f} MB (targets: <= 1 s, <= 300 MB)"
    )
    print(f"  last pair: {found['compared']} tensors compared, {found['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
