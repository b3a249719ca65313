"""Comparing many pairs: in this process, in a local process pool, or as tasks on a Ray cluster.

Each pair is independent (:func:`.compare.compare_pair`); results come back in completion order,
with a progress bar on a terminal, each pair's rows packed where they were compared (:mod:`.row_store`).
"""

from __future__ import annotations

import gc
import multiprocessing
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

from msprobe_hooks.analysis.comparing.compare import compare_pair
from msprobe_hooks.analysis.comparing.row_store import PackedRows, pack
from msprobe_hooks.analysis.pairing.pairs import Pair
from msprobe_hooks.analysis.results import PairResult

Outcome = tuple[PairResult, PackedRows]
# A worker process pays for itself from about this many pairs (its start-up and the rows' pickling cost
# about what comparing a few small pairs in this process does: benchmarks/bench_compare.py).
PAIRS_PER_PROCESS = 4


def compare_packed(index: int, pair: Pair, threshold: float, mapping: str | None = None) -> Outcome:
    """:func:`.compare.compare_pair`, its rows packed for the report."""
    result, rows = compare_pair(index, pair, threshold, mapping)
    return result, pack(result.pair, rows)


def compare_all(pairs: Sequence[Pair], threshold: float, jobs: int, mapping: str | None = None) -> Iterator[Outcome]:
    """Every pair compared by up to ``jobs`` processes, one per :data:`PAIRS_PER_PROCESS` pairs (in this one
    for fewer: a pool would cost more than it saves)."""
    from tqdm import tqdm

    workers = max(1, min(jobs, len(pairs) // PAIRS_PER_PROCESS))
    if workers == 1:
        for i, pair in enumerate(tqdm(pairs, unit="pair", disable=None)):
            yield compare_packed(i, pair, threshold, mapping)
        return
    # A worker collects its garbage, whatever the caller does (compare turns the collector off in its own process).
    # A process whose torch already ran (tensor-mode pairs compared here before) must not fork workers that run
    # torch again: its thread pools do not survive a fork (the workers hang). Spawned workers start clean.
    context = multiprocessing.get_context("spawn") if "torch" in sys.modules else None
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=gc.enable) as pool:
        futures = {pool.submit(compare_packed, i, pair, threshold, mapping) for i, pair in enumerate(pairs)}
        for future in tqdm(as_completed(futures), total=len(futures), unit="pair", disable=None):
            futures.discard(future)  # a done future holds its pair's rows: dropped once they are handed on
            yield future.result()


def compare_on_ray(
    pairs: Sequence[Pair], threshold: float, address: str, mapping: str | None = None
) -> Iterator[Outcome]:
    """Every pair as one task on an existing Ray cluster (verl jobs run one), results in completion order."""
    import ray
    from tqdm import tqdm

    ray.init(address=address, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1)(compare_packed)
        pending = [task.remote(i, pair, threshold, mapping) for i, pair in enumerate(pairs)]
        with tqdm(total=len(pending), unit="pair", disable=None) as bar:
            while pending:
                done, pending = ray.wait(pending)
                for ref in done:
                    bar.update()
                    yield ray.get(ref)
    finally:
        ray.shutdown()  # disconnects this driver; the cluster stays up
