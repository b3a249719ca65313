"""``msprobe-hooks compare pairs.jsonl -o report/``: the command around :mod:`msprobe_hooks.analysis.compare`."""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from msprobe_hooks.analysis.results import DEFAULT_THRESHOLD, THRESHOLD_OF

if TYPE_CHECKING:
    from msprobe_hooks.analysis.pairs import Pair
    from msprobe_hooks.analysis.plots import Painter

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


def _fail(message: str) -> int:
    print(f"msprobe-hooks compare: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from msprobe_hooks.analysis import names, pairs, plots

    if not math.isfinite(args.threshold) or args.threshold <= 0:
        return _fail(f"--threshold {args.threshold}: expected a positive number")
    if args.jobs < 1:
        return _fail(f"--jobs {args.jobs}: expected 1 or more")
    mapping = os.path.abspath(args.mapping) if args.mapping else None
    try:
        names.load(mapping)  # a bad mapping file fails here, before any pair
    except names.MappingError as exc:
        return _fail(str(exc))
    try:
        pair_list = list(pairs.read(args.pairs))
    except OSError as exc:
        return _fail(f"cannot read {args.pairs}: {exc.strerror}")
    except pairs.PairsFileError as exc:
        return _fail(str(exc))
    if not pair_list:
        return _fail(f"{args.pairs} holds no pairs (run align first)")
    # With a second core, the figures' process starts now and imports matplotlib while the pairs are compared.
    painter = plots.Painter(separate_process=args.jobs > 1)
    try:
        with _no_collector():
            return _compare(args, pair_list, mapping, painter)
    finally:
        painter.finish()


@contextlib.contextmanager
def _no_collector() -> Iterator[None]:
    """Python's cyclic garbage collector off while pairs are compared here: each pair makes thousands of small
    objects holding no cycles (its rows, the entries read), which each pass of the collector went over again."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _compare(args: argparse.Namespace, pair_list: list[Pair], mapping: str | None, painter: Painter) -> int:
    from msprobe_hooks.analysis import pairs, pool, report, run_view, symptom
    from msprobe_hooks.analysis.results import Verdict
    from msprobe_hooks.analysis.row_store import RowStore

    try:
        os.makedirs(args.output, exist_ok=True)
    except OSError as exc:
        return _fail(f"-o {args.output}: cannot make the report folder ({exc.strerror})")
    results = []
    if args.ray:
        outcomes = pool.compare_on_ray(pair_list, args.threshold, args.ray, mapping)
    else:
        outcomes = pool.compare_all(pair_list, args.threshold, args.jobs, mapping)
    with RowStore(args.output) as store:  # each pair's rows on disk as it comes: memory stays flat in them
        try:
            for result, packed in outcomes:
                results.append(result)
                store.add(packed)
        except ImportError as exc:
            return _fail(f"--ray {args.ray}: cannot import ray ({exc}); install ray")
        except (ConnectionError, RuntimeError) as exc:
            if not args.ray:
                raise
            return _fail(f"--ray {args.ray}: no Ray cluster there ({exc})")
        # The logs' paths, like the dumps', may be relative to the pairs file's folder (it moves with the trees).
        logs = symptom.gap_logs(pairs.resolve(p.train.log, args.pairs) for p in pair_list if p.train.log)
        gaps = symptom.read_gaps(logs)
        found = report.answer(results, store, gaps)
        written = report.write(args.output, found, args.threshold, painter)
    for line in report.summary_lines(found, args.threshold):
        print(line)
    if args.tensorboard:
        from msprobe_hooks.analysis import events

        views = found.steps or run_view.steps(results, store.layer_errors, gaps)
        print(f"tensorboard: {events.write(args.tensorboard, views)} ({len(views)} global steps)")
    print(f"report: {written}")
    # Not a verdict: a pair that failed or had nothing to compare is a collection problem to look at.
    return 1 if any(r.verdict in (Verdict.FAILED, Verdict.NOTHING_COMPARED) for r in results) else 0
