"""Every pair's rows on disk, not in memory, from the moment the pair is compared (``modules.csv`` and the page).

A thousand pairs of a 28-layer model are two million rows: held as objects until the report, they were most of
compare's memory (growing with the run) and much of its time. Each pair's rows leave the process that compared them
packed (:func:`pack`): their lines of ``modules.csv`` (the column kinds are fixed by the row type, so a pair's lines
need no other pair's), the rows pickled, and the little the report needs of every pair (its status counts, its
largest error per decoder layer). :class:`RowStore` appends the packed pairs to two temporary files in the report
folder as they arrive, in any order; ``modules.csv`` is then copied out in pair order, and only the pairs the page
details are read back as rows.
"""

from __future__ import annotations

import math
import os
import pickle
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from msprobe_hooks.analysis.results import MODULE_COLUMN_KINDS, MODULE_COLUMNS, ModuleRow, Status, module_row_values
from msprobe_hooks.analysis.table import Table, csv_header


@dataclass
class PackedRows:
    """One pair's rows as they travel from a worker: what the report keeps of them in memory, and the rest as bytes."""

    pair: int
    lines: bytes  # its lines of modules.csv (UTF-8)
    rows: bytes  # the rows, pickled
    statuses: Counter[str]  # rows per status
    layer_errors: dict[int, float]  # decoder layer -> the largest error of its compared rows


def pack(pair: int, rows: Sequence[ModuleRow]) -> PackedRows:
    """``rows`` (one pair's, in model order) packed for :meth:`RowStore.add`."""
    columns = list(zip(*map(module_row_values, rows), strict=True))
    lines = Table.of_columns(MODULE_COLUMNS, columns).csv_body(MODULE_COLUMN_KINDS) if rows else ""
    layer_errors: dict[int, float] = {}
    for r in rows:
        if r.status is Status.COMPARED and r.layer is not None and r.error is not None and not math.isnan(r.error):
            layer_errors[r.layer] = max(layer_errors.get(r.layer, r.error), r.error)
    statuses = Counter(str(r.status) for r in rows if r.status is not None)
    return PackedRows(pair, lines.encode(), pickle.dumps(rows, pickle.HIGHEST_PROTOCOL), statuses, layer_errors)


class RowStore:
    """The packed pairs of one report: ``modules.csv``'s lines and the rows in two unnamed temporary files (gone when
    the store is closed, or the process ends), the statuses and layer errors of every pair in memory."""

    def __init__(self, folder: str | None = None) -> None:
        self._lines = tempfile.TemporaryFile(dir=folder)  # noqa: SIM115  (closed by close(): the store's life)
        self._rows = tempfile.TemporaryFile(dir=folder)  # noqa: SIM115
        # pair -> (offset, size) of its lines, and of its pickled rows
        self._where: dict[int, tuple[int, int, int, int]] = {}
        self.statuses: Counter[str] = Counter()
        self.layer_errors: dict[int, dict[int, float]] = {}  # pair -> decoder layer -> largest error

    def add(self, packed: PackedRows) -> None:
        if packed.pair in self._where:
            raise ValueError(f"pair {packed.pair} stored twice")
        lines_at, rows_at = self._lines.seek(0, os.SEEK_END), self._rows.seek(0, os.SEEK_END)
        self._lines.write(packed.lines)
        self._rows.write(packed.rows)
        self._where[packed.pair] = (lines_at, len(packed.lines), rows_at, len(packed.rows))
        self.statuses.update(packed.statuses)
        self.layer_errors[packed.pair] = packed.layer_errors

    def rows(self, pairs: Iterable[int]) -> list[ModuleRow]:
        """The rows of these pairs (those stored), in pair, then model order."""
        found: list[ModuleRow] = []
        for pair in sorted(set(pairs) & self._where.keys()):
            _, _, at, size = self._where[pair]
            self._rows.seek(at)
            found.extend(pickle.loads(self._rows.read(size)))
        return found

    def write_csv(self, path: str) -> None:
        """``modules.csv``: every stored row, in pair, then model order (what pandas writes of them all)."""
        with open(path, "wb") as out:
            out.write(csv_header(MODULE_COLUMNS).encode())
            for pair in sorted(self._where):
                at, size, _, _ = self._where[pair]
                self._lines.seek(at)
                out.write(self._lines.read(size))  # one pair's lines: a few hundred kB at most

    def close(self) -> None:
        self._lines.close()
        self._rows.close()

    def __enter__(self) -> RowStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
