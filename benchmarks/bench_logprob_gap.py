"""Cost of the log-prob gap log (``logprob_gap.jsonl``) on verl's real FSDP2 engine on CPU: medians and the share.

Every actor log-prob pass writes one gap line per sample when the batch holds the rollout's log-probs,
dumped or not. Here the pass is not dumped (``DUMP_PHASE=update_actor``), so what the patch adds to it
is the gap alone: the time inside :meth:`ActorDumper.log_prob_gap` (reading the samples, the statistics,
the temperature, the lines written) is measured per pass, beside the pass itself with the patch applied
and with it reverted; and, side by side in the same rounds, the gap with every line carrying its tokens
(``MSPROBE_HOOKS_GAP_TOKENS=all``: token ids, per-token log-probs), per micro-batch too. The process's one
``engine.jsonl`` line (:meth:`ActorDumper.record_engine`, after its first actor forward) is timed once.
Target: the gap at most 1 % of the log-prob pass.

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

    from msprobe_hooks import config, patching
    from msprobe_hooks.patches.verl import VERL_FSDP_ENGINE
    from msprobe_hooks.training.actor_dump import dumper

    actor_dumper = dumper()
    gap_work: list[float] = []
    engine_line: list[float] = []
    original, original_record = actor_dumper.log_prob_gap, actor_dumper.record_engine

    def timed(*args: object) -> None:
        begin = time.perf_counter()
        original(*args)
        gap_work.append(time.perf_counter() - begin)

    def timed_record(*args: object) -> None:
        begin = time.perf_counter()
        original_record(*args)
        if actor_dumper._engine_log.done and not engine_line:
            engine_line.append(time.perf_counter() - begin)

    actor_dumper.log_prob_gap = timed
    actor_dumper.record_engine = timed_record
    plain_config = bootstrap.current_config()
    tokens_config = config.load(
        {**os.environ, "DUMP_ON": "1", "DUMP_PHASE": "update_actor", "MSPROBE_HOOKS_GAP_TOKENS": "all"}
    )
    gen = torch.Generator().manual_seed(0)
    samples = [
        replace(s, rollout_log_probs=tuple((-4.8 + 0.3 * torch.randn(len(s.response), generator=gen)).tolist()))
        for s in verl_cpu.random_samples(SAMPLES, 0, prompt_lens=prompt_lens, response_lens=response_lens)
    ]
    variants = ("plain", "patch", "tokens")
    timings: dict[str, list[float]] = {"plain": [], "patch": [], "tokens": [], "gap": [], "gap_tokens": []}
    for round_ in range(passes + 1):  # round 0 warms up
        for variant in variants[round_ % 3 :] + variants[: round_ % 3]:
            patching.revert(VERL_FSDP_ENGINE.name)
            if variant != "plain":
                cfg = tokens_config if variant == "tokens" else plain_config
                patching.apply(VERL_FSDP_ENGINE, transformer_impl, config=cfg)
            before = len(gap_work)
            try:
                start = time.perf_counter()
                verl_cpu.log_probs(engine, verl_cpu.make_batch(samples, temperature=0.8))
                seconds = time.perf_counter() - start
            finally:
                patching.revert(VERL_FSDP_ENGINE.name)
                patching.apply(VERL_FSDP_ENGINE, transformer_impl, config=plain_config)
            if round_:
                timings[variant].append(seconds)
                if variant != "plain":
                    timings["gap" if variant == "patch" else "gap_tokens"].append(sum(gap_work[before:]))
    timings["engine_line"] = engine_line
    logs = [
        os.path.join(root, "logprob_gap.jsonl") for root, _, files in os.walk(out_dir) if "logprob_gap.jsonl" in files
    ]
    with open(logs[0], encoding="utf-8") as handle:
        written = sum(1 for _ in handle)
    assert written == 2 * SAMPLES * (passes + 1), f"{written} gap lines for {passes + 1} rounds of {SAMPLES} samples"
    return timings


def _per_micro_batch(
    prompt_lens: tuple[int, ...], response_lens: tuple[int, ...], calls: int = 300
) -> dict[str, float]:
    """Microseconds per micro-batch of 2 samples, without an engine (so without its noise): the gap lines as
    written by default, the same with their tokens (alternating, same micro-batch), and the temperature read."""
    from dataclasses import replace

    import torch

    from cpu_kit import verl_cpu
    from msprobe_hooks import config
    from msprobe_hooks.training import logprob_gap
    from msprobe_hooks.training.micro_batch import describe_samples

    gen = torch.Generator().manual_seed(0)
    samples = [
        replace(s, rollout_log_probs=tuple((-4.8 + 0.3 * torch.randn(len(s.response), generator=gen)).tolist()))
        for s in verl_cpu.random_samples(2, 0, prompt_lens=prompt_lens, response_lens=response_lens)
    ]
    batch = verl_cpu.make_batch(samples, temperature=0.8)
    offsets = batch["input_ids"].offsets()
    log_probs = torch.nested.nested_tensor_from_jagged(torch.randn(int(offsets[-1]), generator=gen), offsets)
    result = (torch.tensor(1.0), {"model_output": {"log_probs": log_probs}})
    times: dict[str, list[float]] = {"lines": [], "tokens": [], "temperature": []}
    with tempfile.TemporaryDirectory(prefix="bench-logprob-gap-") as tmp:
        settings = {"lines": "none", "tokens": "all"}
        cfgs = {k: config.load({"DUMP_ON": "1", "MSPROBE_HOOKS_GAP_TOKENS": v}) for k, v in settings.items()}
        logs = {k: logprob_gap.GapLog(lambda cfg, k=k: os.path.join(tmp, k)) for k in settings}
        for i in range(calls):
            for kind in ("lines", "tokens") if i % 2 else ("tokens", "lines"):
                start = time.perf_counter()
                logs[kind].write(cfgs[kind], 0, batch, result, False)
                times[kind].append(time.perf_counter() - start)
            described = describe_samples(batch)
            start = time.perf_counter()
            logprob_gap.temperatures(batch, described)
            times["temperature"].append(time.perf_counter() - start)
    return {kind: statistics.median(values[calls // 10 :]) * 1e6 for kind, values in times.items()}


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
        f"{'gap':>10}{'gap/pass':>10}{'gap+tokens':>12}{'per mb':>10}{'engine.jsonl':>14}"
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
        plain, patch, gap, gap_tokens = (statistics.median(results[k]) for k in ("plain", "patch", "gap", "gap_tokens"))
        tokens = sum(prompt_lens[i % len(prompt_lens)] + response_lens[i % len(response_lens)] for i in range(SAMPLES))
        per_micro_batch = (gap_tokens - gap) / (SAMPLES // 2)
        print(
            f"{f'{layers}x{hidden}':<13}{tokens:>8}{rounds:>8}{plain * 1e3:>20.1f}ms{patch * 1e3:>13.1f}ms"
            f"{gap * 1e3:>8.2f}ms{gap / patch:>10.2%}{gap_tokens * 1e3:>10.2f}ms{per_micro_batch * 1e6:>8.0f}us"
            f"{results['engine_line'][0] * 1e3:>12.2f}ms"
        )
    print(
        "gap: per pass, temperature included; gap+tokens: every line with its token ids and per-token log-probs "
        "(MSPROBE_HOOKS_GAP_TOKENS=all), per mb: what the tokens add per micro-batch of 2 samples; engine.jsonl: "
        "its one line, once per process"
    )
    print("target: the gap at most 1 % of the log-prob pass")
    print("\nper micro-batch of 2 samples, no engine (medians):")
    print(f"{'prompts':>14}{'responses':>14}{'gap lines':>12}{'with tokens':>13}{'added':>10}{'temperature':>13}")
    for prompt_lens, response_lens in (((32, 48), (24, 32)), ((128, 192), (96, 128)), ((1024, 2048), (2048, 4096))):
        us = _per_micro_batch(prompt_lens, response_lens)
        print(
            f"{str(prompt_lens):>14}{str(response_lens):>14}{us['lines']:>10.0f}us{us['tokens']:>11.0f}us"
            f"{us['tokens'] - us['lines']:>8.0f}us{us['temperature']:>11.1f}us"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
