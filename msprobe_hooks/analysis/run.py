"""The whole of ``compare`` in one call: the pairs file in, the report folder and the answer out.

``msprobe-hooks compare`` only parses its arguments, calls :func:`compare_file` and prints; a notebook or a CI
gate calls it the same way::

    from msprobe_hooks.analysis.run import CompareOptions, compare_file

    compared = compare_file("pairs.jsonl", "report/", CompareOptions(threshold=1e-4))
    compared.answer.results  # one PairResult per pair

The stages it runs, each importing only those before it: ``pairing`` (the pairs file), ``comparing`` (the rows of
each pair, in a pool or on Ray), ``answer`` (verdicts, causes, the run), ``report`` (the files). The verdict's rules
are built here, once, and handed to each pair's worker (:mod:`.one_pair`: compare, judge, pack).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from msprobe_hooks.analysis import one_pair
from msprobe_hooks.analysis.answer import verdict
from msprobe_hooks.analysis.answer.assemble import Answer, assemble
from msprobe_hooks.analysis.answer.evidence import gather
from msprobe_hooks.analysis.answer.symptom import read_gaps
from msprobe_hooks.analysis.comparing import logits, names, pool
from msprobe_hooks.analysis.comparing.row_store import RowStore
from msprobe_hooks.analysis.pairing import pairs
from msprobe_hooks.analysis.pairing.side_logs import requests
from msprobe_hooks.analysis.report import writer
from msprobe_hooks.analysis.report.plots import Painter
from msprobe_hooks.analysis.results import DEFAULT_THRESHOLD, Verdict


class CompareInputError(ValueError):
    """Input ``compare`` cannot start on (a bad option, an unreadable pairs file or name map, a report folder it
    cannot make, no Ray cluster at the address): the message names it and what is accepted."""


@dataclass(frozen=True)
class CompareOptions:
    """What ``compare``'s options set; the defaults are the CLI's."""

    threshold: float = DEFAULT_THRESHOLD
    mapping: str | None = None  # a name-map file that adds to or replaces the built-in rules
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)
    ray: str | None = None  # a Ray cluster's address: the pairs as its tasks instead of a local pool
    tensorboard: str | None = None  # a folder for the run's scalars as TensorBoard event files

    def check(self) -> None:
        if not math.isfinite(self.threshold) or self.threshold <= 0:
            raise CompareInputError(f"--threshold {self.threshold}: expected a positive number")
        if self.jobs < 1:
            raise CompareInputError(f"--jobs {self.jobs}: expected 1 or more")


@dataclass
class Compared:
    """What :func:`compare_file` did: the answer, and where the report and the TensorBoard files went."""

    answer: Answer
    index: str  # the report's index.html
    lines: list[str]  # the report's answer, its first lines: the cause, the first divergence, each section's verdict
    tensorboard: str | None = None  # the event file, when asked for
    tensorboard_steps: int = 0  # the global steps written into it

    @property
    def failed(self) -> bool:
        """A pair failed or had nothing to compare: a collection problem to look at, not a verdict."""
        return any(r.verdict in (Verdict.FAILED, Verdict.NOTHING_COMPARED) for r in self.answer.results)


def compare_file(pairs_file: str, output: str, options: CompareOptions | None = None) -> Compared:
    """Compare every pair of ``pairs_file`` (align's output) and write the report into ``output``.

    Bad input raises :class:`CompareInputError` before any pair is compared."""
    options = options or CompareOptions()
    options.check()
    mapping = os.path.abspath(options.mapping) if options.mapping else None
    try:
        names.load(mapping)  # a bad mapping file fails here, before any pair
    except names.MappingError as exc:
        raise CompareInputError(str(exc)) from None
    try:
        pair_list = list(pairs.read(pairs_file))
    except OSError as exc:
        raise CompareInputError(f"cannot read {pairs_file}: {exc.strerror}") from None
    except pairs.PairsFileError as exc:
        raise CompareInputError(str(exc)) from None
    if not pair_list:
        raise CompareInputError(f"{pairs_file} holds no pairs (run align first)")
    try:
        os.makedirs(output, exist_ok=True)
    except OSError as exc:
        raise CompareInputError(f"-o {output}: cannot make the report folder ({exc.strerror})") from None
    # With a second core, the figures' process starts now and imports matplotlib while the pairs are compared.
    painter = Painter(separate_process=options.jobs > 1)
    try:
        with _no_collector():
            return _compare(pair_list, output, options, mapping, painter)
    finally:
        painter.finish()


def _compare(
    pair_list: list[pairs.Pair],
    output: str,
    options: CompareOptions,
    mapping: str | None,
    painter: Painter,
) -> Compared:
    work = functools.partial(one_pair.compare_packed, rules=verdict.rules(options.threshold), mapping=mapping)
    if options.ray:
        outcomes = pool.compare_on_ray(pair_list, work, options.ray)
    else:
        outcomes = pool.compare_all(pair_list, work, options.jobs)
    results = []
    with RowStore(output) as store:  # each pair's rows on disk as it comes: memory stays flat in them
        try:
            for result, packed in outcomes:
                results.append(result)
                store.add(packed)
        except ImportError as exc:
            raise CompareInputError(f"--ray {options.ray}: cannot import {exc.name or 'ray'} ({exc})") from None
        except (ConnectionError, RuntimeError) as exc:
            if not options.ray:
                raise
            raise CompareInputError(f"--ray {options.ray}: no Ray cluster there ({exc})") from None
        gaps = read_gaps(dict.fromkeys(log for p in pair_list for log in p.train.gap_logs or ()))
        asked = requests(p.generate.requests_log for p in pair_list)
        evidence = gather(pair_list, gaps, asked)
        rollout = logits.Rollout(
            (evidence.rollout.numerics or {}).get("logprobs_mode"),
            (evidence.rollout.configuration or {}).get("vocab_size"),
            asked,
        )
        answer = assemble(results, store, gaps, evidence, logits.check(pair_list, gaps, rollout))
        index, lines = writer.write(output, answer, options.threshold, painter)
    compared = Compared(answer, index, lines)
    if options.tensorboard:
        from msprobe_hooks.analysis.answer import run_view
        from msprobe_hooks.analysis.report import events

        views = answer.steps or run_view.steps(answer.results, store.layer_errors, gaps)
        compared.tensorboard, compared.tensorboard_steps = events.write(options.tensorboard, views), len(views)
    return compared


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
