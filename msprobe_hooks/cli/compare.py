"""``msprobe-hooks compare pairs.jsonl -o report/``: parses, calls :func:`.analysis.run.compare_file`, prints."""

from __future__ import annotations

import argparse
import os
import sys

from msprobe_hooks.analysis.results import DEFAULT_THRESHOLD, THRESHOLD_OF, Cause

DESCRIPTION = """\
Compare every pair that `msprobe-hooks align` wrote, module by module, across the two engines' names
(fused qkv_proj/gate_up_proj from their parts, vLLM's (hidden, residual) norms), and name the first
module, in the model's order, where the training forward and the inference prefill (or, for a decode
pair, one decode token) diverge: where the error steps up against the pair's own noise, and where it
crosses --threshold. With decode pairs or the training side's logprob_gap.jsonl, it also says per sample
where its log-prob gap comes from: the prefill path, the decode path, or neither. The first line says what
kind of cause it is, `cause: CAUSE (PATH): sentence` (module, sampling, inputs, precision,
configuration, routing, noise, none, unknown), with its evidence in diagnosis.json. Writes into the
report folder: summary.md, diagnosis.json, modules.csv (every tensor of every pair), pairs.csv (one line
per pair), samples.csv (per sample: gap and causes; decode_by_token.png), with several global steps
steps.csv and run_by_step.png, for MoE routing.csv, error_by_depth.png and index.html (one page that opens
offline). Exit status: 0 compared (whatever the verdict), 1 a pair failed
or had nothing to compare, or the cause is one of --fail-on, 2 bad input. See docs/analysis.md."""


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
    parser.add_argument(
        "--fail-on",
        metavar="CAUSE[,CAUSE...]",
        type=_causes,
        default=frozenset(),
        help="exit 1 when the diagnosis is one of these causes (" + ", ".join(c.value for c in Cause) + "): a gate "
        "for CI, e.g. --fail-on module,precision,unknown",
    )


def _causes(text: str) -> frozenset[Cause]:
    """--fail-on's value: causes separated by commas, each one of :class:`Cause`'s words."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    accepted = {c.value: c for c in Cause}
    unknown = [w for w in words if w not in accepted]
    if unknown or not words:
        raise argparse.ArgumentTypeError(
            f"{text!r}: {', '.join(unknown) or 'no cause'} is not a cause; accepted: {', '.join(accepted)}"
        )
    return frozenset(accepted[w] for w in words)


def run(args: argparse.Namespace) -> int:
    from msprobe_hooks.analysis.report.writer import summary_lines
    from msprobe_hooks.analysis.run import CompareInputError, CompareOptions, compare_file

    options = CompareOptions(args.threshold, args.mapping, args.jobs, args.ray, args.tensorboard)
    try:
        compared = compare_file(args.pairs, args.output, options)
    except CompareInputError as exc:
        print(f"msprobe-hooks compare: {exc}", file=sys.stderr)
        return 2
    for line in summary_lines(compared.answer, args.threshold, compared.lines):
        print(line)
    if compared.tensorboard:
        print(f"tensorboard: {compared.tensorboard} ({compared.tensorboard_steps} global steps)")
    print(f"report: {compared.index}")
    # A pair that failed or had nothing to compare is a collection problem to look at; --fail-on's causes a gate.
    return 1 if compared.failed or compared.answer.diagnosis.cause in args.fail_on else 0
