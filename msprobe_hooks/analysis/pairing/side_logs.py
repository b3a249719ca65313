"""The evidence logs the pairs name beside each side's dumps, read: each engine's settings, the rollout's requests.

``engine.jsonl`` (either side, once per model load: :mod:`msprobe_hooks.numerics`) and ``requests.jsonl`` (the
inference side, once per request: its sampling parameters and prompt token ids). What they mean for a diagnosis
is the answer stage's (:mod:`.answer.evidence`); here they are only read, with the one JSON-lines reader.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from msprobe_hooks.jsonl import records


def engine_settings(paths: Iterable[str | None]) -> list[dict[str, Any]]:
    """The engine lines in force in each process of ``paths`` (its last line: a reload writes a new one), in the
    order first named; a process without the log is left out."""
    found = []
    for path in dict.fromkeys(p for p in paths if p):
        lines = [record for _, record in records(path)]
        if lines:
            found.append(lines[-1])
    return found


def requests(paths: Iterable[str | None]) -> dict[str, dict[str, Any]]:
    """The rollout's request lines of the processes in ``paths``, by request id with the engine's suffix stripped
    (``base``): the pairs' keys."""
    found: dict[str, dict[str, Any]] = {}
    for path in dict.fromkeys(p for p in paths if p):
        for _, record in records(path):
            base = record.get("base") or record.get("request_id")
            if base is not None:
                found[str(base)] = record
    return found
