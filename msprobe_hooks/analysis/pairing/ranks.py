"""The ranks of one inference engine, and the replica that served each pair.

Every rank of a TP engine runs every prefill and logs it alike: :func:`engine_ranks` gathers the dumps of one
prefill from every rank of its engine (``compare`` makes the split tensors whole from them,
:mod:`msprobe_hooks.analysis.comparing.shards`); :func:`replica_lines` is ``align``'s account of the replicas.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from msprobe_hooks.analysis.pairing.logs import GenerateStep

# --- align: the ranks of one engine ----------------------------------------------------------------


class _HasStep(Protocol):
    @property
    def step(self) -> GenerateStep: ...


C = TypeVar("C", bound=_HasStep)


def _signature(step: GenerateStep) -> tuple[Any, ...]:
    """What every rank of one engine logs alike for one model step: its number, engine and packed rows."""
    rows = tuple((row.base, row.prompt_hash, row.tokens, row.offset, row.full) for row in step.rows)
    return step.step, step.engine, step.total_tokens, rows


def engine_ranks(chosen: C, candidates: Iterable[C]) -> list[C] | None:
    """The dumps of ``chosen``'s prefill on every rank of its engine, in rank order (``chosen`` among them).

    The workers of one TP engine run every model step together: each logs the step under the same
    number, with the same rows, in a log of its own (one per process). ``candidates`` are the prefill
    dumps of the request on any rank of any engine. None when a rank occurs twice among them (two
    replicas ran the request at the same step number): the ranks of ``chosen``'s engine cannot be told.
    """
    wanted = _signature(chosen.step)
    same = [c for c in candidates if _signature(c.step) == wanted and c.step.log != chosen.step.log]
    ranks = [chosen.step.rank] + [c.step.rank for c in same]
    if len(set(ranks)) != len(ranks):
        return None
    return sorted([chosen, *same], key=lambda c: -1 if c.step.rank is None else c.step.rank)


# --- which replica served a pair ---------------------------------------------------------------------


def workers(generate: Any) -> tuple[tuple[int | None, int | None], ...]:
    """(rank, pid) of every worker of the engine that ran a pair's prefill (a ``pairs.GenerateSide``).

    The engine (the replica) is known by its workers' processes: the one worker of a TP=1 engine, every
    rank's of a TP engine (``generate.shards``).
    """
    if generate.shards:
        return tuple((shard.rank, shard.pid) for shard in generate.shards)
    return ((generate.rank, generate.pid),)


def by_replica(pairs: Iterable[Any]) -> dict[tuple[tuple[int | None, int | None], ...], Counter[str]]:
    """Per replica (its :func:`workers`), how many pairs it served under each rank rule, in first-seen order."""
    found: dict[tuple[tuple[int | None, int | None], ...], Counter[str]] = {}
    for pair in pairs:
        found.setdefault(workers(pair.generate), Counter())[str(pair.rank_rule)] += 1
    return found


def replica_lines(pairs: Iterable[Any]) -> list[str]:
    """``align``'s lines on the replicas that served the pairs; none for one engine of one rank (TP=1 as before)."""
    found = by_replica(pairs)
    if len(found) < 2 and all(len(w) < 2 for w in found):
        return []
    lines = ["pairs by replica (the inference engine that ran the prefill: TP size, ranks and processes):"]
    for engine, rules in found.items():
        ranks = "+".join("?" if rank is None else str(rank) for rank, _ in engine)
        pids = "+".join("?" if pid is None else str(pid) for _, pid in engine)
        counts = ", ".join(f"{rule} {n}" for rule, n in rules.items())
        lines.append(
            f"  TP {len(engine)}, rank{'s' if len(engine) > 1 else ''} {ranks}, pid {pids}: "
            f"{sum(rules.values())} pairs (rank rule: {counts})"
        )
    return lines
