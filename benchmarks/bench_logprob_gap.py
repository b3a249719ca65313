"""Cost of the log-prob gap log (``logprob_gap.jsonl``) on verl's real FSDP2 engine on CPU: medians and the share.

Every actor log-prob pass writes one gap line per sample when the batch holds the rollout's log-probs,
dumped or not. Here the pass is not dumped (``DUMP_PHASE=update_actor``), so what the patch adds to it
is the gap alone: the time inside :meth:`ActorDumper.log_prob_gap` (reading the samples, the statistics,
the lines written) is measured per pass, beside the pass itself with the patch applied and with it
reverted. Target: the gap at most 1 % of the log-prob pass.

Two shapes: the tiny model of ``bench_verl_engine.py`` (a pass of a few tens of milliseconds, where the
gap's fixed cost per micro-batch shows most) and a larger one with longer sequences (still far smaller
than a real actor's pass, which takes seconds on an accelerator for the same fixed cost).

    python benchmarks/bench_logprob_gap.py [--passes 15]

The engine runs in a child process; the two variants' passes are interleaved there, round by round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the repository root: cpu_kit

SAMPLES = 8
# (layers, hidden, prompt lengths, response lengths, rounds as a share of --passes)
SHAPES = (
    (4, 128, (32, 48, 40, 56), (24, 32), 1.0),
    (6, 384, (128, 192, 160, 224), (96, 128), 0.34),
)


def _timings(
    model_dir: str, passes: int, out_dir: str, prompt_lens: list[int], response_lens: list[int]
) -> dict[str, list[float]]:
    """Seconds per log-prob pass, patched and not, and seconds of gap work per patched pass."""
    from msprobe_hooks import bootstrap

    bootstrap.activate(
        {
            "DUMP_ON": "1",
            "DUMP_PHASE": "update_actor",
            "MSPROBE_HOOKS_OUTPUT_DIR": out_dir,
            "MSPROBE_HOOKS_LOG_LEVEL": "ERROR",
        }
    )
    from dataclasses import replace

    import torch

    from cpu_kit import verl_cpu

    verl_cpu.init_process()
    engine = verl_cpu.make_engine(model_dir)
    from verl.workers.engine.fsdp import transformer_impl

    from msprobe_hooks import patching
    from msprobe_hooks.patches.verl import VERL_FSDP_ENGINE
    from msprobe_hooks.training.actor_dump import dumper

    actor_dumper = dumper()
    gap_work: list[float] = []
    original = actor_dumper.log_prob_gap

    def timed(*args: object) -> None:
        begin = time.perf_counter()
        original(*args)
        gap_work.append(time.perf_counter() - begin)

    actor_dumper.log_prob_gap = timed
    gen = torch.Generator().manual_seed(0)
    samples = [
        replace(s, rollout_log_probs=tuple((-4.8 + 0.3 * torch.randn(len(s.response), generator=gen)).tolist()))
        for s in verl_cpu.random_samples(SAMPLES, 0, prompt_lens=prompt_lens, response_lens=response_lens)
    ]
    variants = ("plain", "patch")
    timings: dict[str, list[float]] = {"plain": [], "patch": [], "gap": []}
    for round_ in range(passes + 1):  # round 0 warms up
        for variant in variants[round_ % 2 :] + variants[: round_ % 2]:
            if variant == "plain":
                patching.revert(VERL_FSDP_ENGINE.name)
            before = len(gap_work)
            try:
                start = time.perf_counter()
                verl_cpu.log_probs(engine, verl_cpu.make_batch(samples))
                seconds = time.perf_counter() - start
            finally:
                patching.apply(VERL_FSDP_ENGINE, transformer_impl, config=bootstrap.current_config())
            if round_:
                timings[variant].append(seconds)
                if variant == "patch":
                    timings["gap"].append(sum(gap_work[before:]))
    logs = [
        os.path.join(root, "logprob_gap.jsonl") for root, _, files in os.walk(out_dir) if "logprob_gap.jsonl" in files
    ]
    with open(logs[0], encoding="utf-8") as handle:
        written = sum(1 for _ in handle)
    assert written == SAMPLES * (passes + 1), f"{written} gap lines for {passes + 1} passes of {SAMPLES} samples"
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=15, help="timed log-prob passes per variant (the tiny model)")
    parser.add_argument("--child", nargs=3, metavar=("MODEL_DIR", "OUT", "SHAPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        prompt_lens, response_lens = json.loads(args.child[2])
        print(json.dumps(_timings(args.child[0], args.passes, args.child[1], prompt_lens, response_lens)))
        return 0

    from cpu_kit import verl_cpu

    print(
        f"verl FSDP2 engine on CPU, {SAMPLES} samples in micro-batches of 2, one gap line each; "
        "medians per log-prob pass"
    )
    print(
        f"{'model':<13}{'tokens':>8}{'rounds':>8}{'pass, patch reverted':>22}{'pass, patched':>15}"
        f"{'gap':>10}{'gap/pass':>10}"
    )
    for layers, hidden, prompt_lens, response_lens, share in SHAPES:
        rounds = max(3, round(args.passes * share))
        with tempfile.TemporaryDirectory(prefix="bench-logprob-gap-") as tmp:
            model_dir = verl_cpu.build_model_dir(os.path.join(tmp, "model"), layers=layers, hidden=hidden)
            env = {k: v for k, v in os.environ.items() if k not in ("DUMP_ON", "PYTHONPATH")}
            env["OMP_NUM_THREADS"] = "1"
            shape = json.dumps([prompt_lens, response_lens])
            command = [sys.executable, __file__, "--passes", str(rounds), "--child", model_dir, tmp + "/dumps", shape]
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            results = json.loads(done.stdout.strip().splitlines()[-1])
        plain, patch, gap = (statistics.median(results[k]) for k in ("plain", "patch", "gap"))
        tokens = sum(prompt_lens[i % len(prompt_lens)] + response_lens[i % len(response_lens)] for i in range(SAMPLES))
        print(
            f"{f'{layers}x{hidden}':<13}{tokens:>8}{rounds:>8}{plain * 1e3:>20.1f}ms{patch * 1e3:>13.1f}ms"
            f"{gap * 1e3:>8.2f}ms{gap / patch:>10.2%}"
        )
    print("target: the gap at most 1 % of the log-prob pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
