"""The diagnosis's cost per pair, beside comparing the same pair: what naming the kind of cause adds to ``compare``.

    python benchmarks/bench_diagnosis.py

The pairs are real (the golden verdict set: verl's FSDP2 engine against vLLM's CPU engine, one pair of each case,
clean and with a planted weight), compared once in process; their results are then repeated to 10, 100 and 1,000
pairs and diagnosed (every rule of ``diagnosis.DEFAULT_RULES``, as ``compare`` runs them, evidence recorded on both
sides). Prints the median microseconds per pair of the diagnosis beside the milliseconds per pair of comparing; no
pass/fail.

Then the logits check (``analysis/comparing/logits.py``: each pair's response token against the rollout's logits row)
on the golden ``logits_loop/tempered`` tree (22 tensor-mode pairs, vLLM's CPU engine, a vocabulary of 128), per pair,
beside comparing those pairs.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

from synthetic_dumps import real_pairs

from msprobe_hooks.analysis.answer.diagnosis import Evidence, Facts, SideEvidence, diagnose_facts
from msprobe_hooks.analysis.answer.symptom import read_gaps
from msprobe_hooks.analysis.answer.verdict import rules
from msprobe_hooks.analysis.comparing import logits
from msprobe_hooks.analysis.one_pair import judged_pair
from msprobe_hooks.analysis.pairing import pairs as pairs_file
from msprobe_hooks.analysis.pairing.side_logs import requests
from msprobe_hooks.analysis.results import DEFAULT_THRESHOLD
from msprobe_hooks.cli import main as cli

REPEATS = 5
LOGITS_TREE = Path(__file__).resolve().parents[1] / "tests" / "golden" / "logits_loop" / "tempered"
SIZES = (10, 100, 1000)
RECORDED = SideEvidence(
    configuration={"rope_theta": 10000.0, "rms_norm_eps": 1e-6},
    sampling={"log-probs temperature": 1.0, "top_k": None, "top_p": 1.0, "min_p": 0.0},
    numerics={"model_dtype": "float32", "kv_cache_dtype": "float32", "head_dtype": "float32"},
)


def _median(run, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        found = real_pairs(Path(folder))
    verdict = rules(DEFAULT_THRESHOLD)
    results = []
    start = time.perf_counter()
    for i, pair in enumerate(found):
        results.append(judged_pair(i, pair, verdict)[0])
    compare_per_pair = (time.perf_counter() - start) / len(found)
    print(f"compare + judge, in process: {compare_per_pair * 1e3:.1f} ms per pair ({len(found)} real pairs)")
    evidence = Evidence(RECORDED, RECORDED)
    for size in SIZES:
        many = [dataclasses.replace(results[i % len(results)], pair=i) for i in range(size)]
        seconds = _median(lambda many=many: diagnose_facts(Facts(many, evidence=evidence)))
        print(
            f"diagnosis of {size:>5} pairs: {seconds * 1e3:8.2f} ms, {seconds / size * 1e6:7.1f} us per pair "
            f"({seconds / size / compare_per_pair:.2%} of comparing one)"
        )
    _logits_check()
    return 0


def _logits_check() -> None:
    with tempfile.TemporaryDirectory() as folder:
        found = Path(folder) / "pairs.jsonl"
        cli(["align", str(LOGITS_TREE / "actor"), str(LOGITS_TREE / "generate"), "-o", str(found)])
        tensor_pairs = list(pairs_file.read(str(found)))
    gaps = read_gaps(dict.fromkeys(log for p in tensor_pairs for log in p.train.gap_logs or ()))
    verdict = rules(DEFAULT_THRESHOLD)
    compare = _median(lambda: [judged_pair(i, p, verdict) for i, p in enumerate(tensor_pairs)], 3)
    check = _median(
        lambda: logits.check(
            tensor_pairs,
            gaps,
            logits.Rollout("processed_logprobs", 128, requests(p.generate.requests_log for p in tensor_pairs)),
        )
    )
    per_pair = check / len(tensor_pairs)
    print(
        f"logits check of {len(tensor_pairs)} tensor-mode pairs: {per_pair * 1e3:.2f} ms per pair "
        f"({per_pair / (compare / len(tensor_pairs)):.1%} of comparing one: {compare / len(tensor_pairs) * 1e3:.1f} ms)"
    )


if __name__ == "__main__":
    sys.exit(main())
