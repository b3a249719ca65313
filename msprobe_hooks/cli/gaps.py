"""``msprobe-hooks gaps TRAIN_DIR``: the samples with the largest log-prob gap, and how to dump just those."""

from __future__ import annotations

import argparse
import os
import sys

DESCRIPTION = """\
Read the training side's logprob_gap.jsonl files (one per process under TRAIN_DIR, the actor dump root:
one line per sample of every actor log-prob pass with rollout log-probs) and print the samples with the
largest gap |old_log_prob - rollout_log_prob| on their response tokens, worst first: the global step,
the request id, the response tokens counted, max and mean (verl's rollout_probs_diff_* on
probabilities beside them), the worst token and how many tokens are over the threshold. Then the
settings that dump those samples' whole sequences (DUMP_SEQUENCES=1 DUMP_REQUEST_IDS=...), for decode
alignment (docs/training.md). Exit status: 0, or 2 when TRAIN_DIR holds no gap log."""

COLUMNS = ("global_step", "request_id", "tokens", "max", "mean", "argmax", "over", "probs_diff_max")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("train_dir", help="the training dump root (the actor config's dump_path)")
    parser.add_argument("--top", type=int, default=10, help="how many samples to print (default 10)")
    parser.add_argument("--global-step", type=int, help="only the samples of this global step")


def _cell(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else "" if value is None else str(value)


def _largest_gap_first(line: dict[str, object]) -> float:
    gap = line.get("max")
    return -(gap if isinstance(gap, (int, float)) else -1)


def run(args: argparse.Namespace) -> int:
    from msprobe_hooks.analysis import layout
    from msprobe_hooks.analysis.answer.symptom import gap_lines
    from msprobe_hooks.join_keys import GAP_LOG

    def fail(message: str) -> int:
        print(f"msprobe-hooks gaps: {message}", file=sys.stderr)
        return 2

    if args.top < 1:
        return fail(f"--top {args.top}: expected 1 or more")
    if not os.path.isdir(args.train_dir):
        return fail(f"TRAIN_DIR {args.train_dir!r} is not a directory; expected the actor config's dump_path")
    logs = layout.gap_logs(args.train_dir)
    if not logs:
        return fail(
            f"no {GAP_LOG} under {args.train_dir} (it is written when the log-prob pass gets the rollout's "
            "log-probs: rollout.calculate_log_probs=True)"
        )
    lines = [line for line in gap_lines(logs) if args.global_step in (None, line.get("global_step"))]
    ranked = sorted(lines, key=_largest_gap_first)
    shown = ranked[: args.top]
    print(f"{len(lines)} samples in {len(logs)} gap logs; the {len(shown)} with the largest gap:")
    table = [COLUMNS, *[tuple(_cell(line.get(name)) for name in COLUMNS) for line in shown]]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    for row in table:
        print("  " + "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
    ids = list(dict.fromkeys(str(line["request_id"]) for line in shown if line.get("request_id") is not None))
    if ids:
        print("dump their whole sequences (tensor mode) for decode alignment, in a run that gives them these ids:")
        print(f"  export DUMP_SEQUENCES=1 DUMP_REQUEST_IDS={','.join(ids)}")
    return 0
