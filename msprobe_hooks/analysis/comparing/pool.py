"""Comparing many pairs: in this process, in a local process pool, or as tasks on a Ray cluster.

Each pair is independent: ``work(index, pair)`` compares one (and whatever else its caller has it do: ``compare``
judges it there too, :mod:`msprobe_hooks.analysis.one_pair`), its rows packed where they were compared
(:mod:`.row_store`); ``work`` pickles (a top-level function, or a partial of one). Results come back in completion
order, with a progress bar on a terminal.
"""

from __future__ import annotations

import gc
import multiprocessing
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

from msprobe_hooks.analysis.comparing.row_store import PackedRows
from msprobe_hooks.analysis.pairing.pairs import Pair
from msprobe_hooks.analysis.results import PairResult

Outcome = tuple[PairResult, PackedRows]
Work = Callable[[int, Pair], Outcome]  # one pair (its index, the pair) to its result and packed rows
# A worker process pays for itself from about this many pairs (its start-up and the rows' pickling cost
# about what comparing a few small pairs in this process does: benchmarks/bench_compare.py).
PAIRS_PER_PROCESS = 4


def compare_all(pairs: Sequence[Pair], work: Work, jobs: int) -> Iterator[Outcome]:
    """Every pair compared by up to ``jobs`` processes, one per :data:`PAIRS_PER_PROCESS` pairs (in this one
    for fewer: a pool would cost more than it saves)."""
    from tqdm import tqdm

    workers = max(1, min(jobs, len(pairs) // PAIRS_PER_PROCESS))
    if workers == 1:
        for i, pair in enumerate(tqdm(pairs, unit="pair", disable=None)):
            yield work(i, pair)
        return
    # A worker collects its garbage, whatever the caller does (compare turns the collector off in its own process).
    # A process whose torch already ran (tensor-mode pairs compared here before) must not fork workers that run
    # torch again: its thread pools do not survive a fork (the workers hang). Spawned workers start clean.
    context = multiprocessing.get_context("spawn") if "torch" in sys.modules else None
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=gc.enable) as pool:
        futures = {pool.submit(work, i, pair) for i, pair in enumerate(pairs)}
        for future in tqdm(as_completed(futures), total=len(futures), unit="pair", disable=None):
            futures.discard(future)  # a done future holds its pair's rows: dropped once they are handed on
            yield future.result()


def _run(work: Work, index: int, pair: Pair) -> Outcome:
    """A Ray task: Ray makes tasks of functions only, not of the partials ``work`` may be."""
    return work(index, pair)


def compare_on_ray(pairs: Sequence[Pair], work: Work, address: str) -> Iterator[Outcome]:
    """Every pair as one task on an existing Ray cluster (verl jobs run one), results in completion order."""
    import ray
    from tqdm import tqdm

    ray.init(address=address, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1)(_run)
        pending = [task.remote(work, i, pair) for i, pair in enumerate(pairs)]
        with tqdm(total=len(pending), unit="pair", disable=None) as bar:
            while pending:
                done, pending = ray.wait(pending)
                for ref in done:
                    bar.update()
                    yield ray.get(ref)
    finally:
        ray.shutdown()  # disconnects this driver; the cluster stays up
