"""``msprobe-hooks compare pairs.jsonl -o report/``: parses, calls :func:`.analysis.run.compare_file`, prints."""

from __future__ import annotations

import argparse
import os
import sys

from msprobe_hooks.analysis.results import DEFAULT_THRESHOLD, THRESHOLD_OF

DESCRIPTION = """\
Compare every pair that `msprobe-hooks align` wrote, module by module, across the two engines' names
(fused qkv_proj/gate_up_proj from their parts, vLLM's (hidden, residual) norms), and name the first
module, in the model's order, where the training forward and the inference prefill (or, for a decode
pair, one decode token) diverge: where the error steps up against the pair's own noise, and where it
crosses --threshold. With decode pairs or the training side's logprob_gap.jsonl, it also says per sample
where its log-prob gap comes from: the prefill path, the decode path, or neither. Writes into the report
folder: summary.md, modules.csv (every tensor of every pair), pairs.csv (one line per pair),
samples.csv (per sample: gap and causes), error_by_depth.png, decode_by_token.png and index.html (one
page that opens offline). Exit status: 0 compared (whatever the verdict), 1 a pair failed or had nothing
to compare, 2 bad input. See docs/analysis.md."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pairs", help="the pairs file written by align")
    parser.add_argument("-o", "--output", default="report", help="the report folder (default report/)")
    parser.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"the relative error {THRESHOLD_OF} above which a tensor diverges (default {DEFAULT_THRESHOLD:g}: "
        "above bf16-vs-fp32 noise, below a 5%% weight change; see docs/analysis.md)",
    )
    parser.add_argument(
        "--mapping",
        metavar="FILE",
        help="a name-map file (YAML or JSON, the form of the built-in one) whose rules add to or replace the "
        "built-in rules, for a model the built-in map does not know (docs/analysis.md, 'The name map')",
    )
    parser.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="also write the run's scalars per global step (first divergent layer, largest error per layer, the "
        "token gap) as TensorBoard event files into DIR, e.g. beside verl's own (trainer.logger=tensorboard)",
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="processes comparing pairs (default: all cores)"
    )
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the pairs as tasks on the existing Ray cluster at ADDRESS (host:port, or auto) instead of a "
        "local pool; the dumps must be readable from its nodes (shared storage)",
    )


def run(args: argparse.Namespace) -> int:
    from msprobe_hooks.analysis.report.writer import summary_lines
    from msprobe_hooks.analysis.run import CompareInputError, CompareOptions, compare_file

    options = CompareOptions(args.threshold, args.mapping, args.jobs, args.ray, args.tensorboard)
    try:
        compared = compare_file(args.pairs, args.output, options)
    except CompareInputError as exc:
        print(f"msprobe-hooks compare: {exc}", file=sys.stderr)
        return 2
    for line in summary_lines(compared.answer, args.threshold):
        print(line)
    if compared.tensorboard:
        print(f"tensorboard: {compared.tensorboard} ({compared.tensorboard_steps} global steps)")
    print(f"report: {compared.index}")
    # Not a verdict: a pair that failed or had nothing to compare is a collection problem to look at.
    return 1 if compared.failed else 0
