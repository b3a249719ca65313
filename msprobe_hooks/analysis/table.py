"""The report's tables without pandas: records under named columns, as CSV, Markdown and HTML.

pandas costs ``compare`` more to import (0.3-0.7 s here) than a few pairs take to compare, so the report does
not use it. The CSV files stay what pandas wrote (``DataFrame(records, columns).to_csv(path, index=False)``),
byte for byte: each column is written as the dtype pandas infers for it (:func:`column_kind`), a missing value
(None, NaN) as an empty cell, quoting by the csv module as pandas does (``tests/analysis/test_table.py``
checks both against pandas).
"""

from __future__ import annotations

import csv
import html
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

# The dtype pandas infers for a column of Python values, as far as it changes what a cell says.
INT, FLOAT, BOOL, OBJECT = "int", "float", "bool", "object"


def missing(value: Any) -> bool:
    """What pandas counts as missing: None and NaN."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def column_kind(values: Sequence[Any]) -> str:
    """The dtype pandas gives a column of these values: integers alone are ``int``; integers and floats, or
    integers with a missing value, ``float`` (so 3 is written 3.0); booleans alone ``bool``; anything else
    ``object`` (each value as its ``str``)."""
    present = [v for v in values if not missing(v)]
    if any(isinstance(v, bool) for v in present):
        return BOOL if len(present) == len(values) and all(isinstance(v, bool) for v in present) else OBJECT
    if not present and values and all(isinstance(v, float) for v in values):
        return FLOAT  # NaN alone
    if not present or not all(isinstance(v, (int, float)) for v in present):
        return OBJECT
    if all(isinstance(v, int) for v in present) and len(present) == len(values):
        return INT
    return FLOAT


def csv_cell(value: Any, kind: str) -> str:
    """A value as pandas' ``to_csv`` writes it in a column of ``kind``."""
    if missing(value):
        return ""
    if kind == FLOAT:
        return repr(float(value))  # numpy's float text is Python's repr
    return str(value)


def float_text(value: float) -> str:
    """A float as the report's Markdown and HTML tables show it: three significant digits."""
    return f"{value:.3g}"


def shown_cell(value: Any, kind: str) -> str:
    """A value as the report's Markdown and HTML tables show it: floats (a ``float`` column's integers too) to
    three significant digits, missing ones empty."""
    if missing(value):
        return ""
    if kind == FLOAT or isinstance(value, float):
        return float_text(float(value))
    return str(value)


class Table:
    """Rows of values under named columns.

    ``columns`` default to every key of the records, in the order they first appear (as pandas orders a
    DataFrame of dicts); a key a record lacks is a missing value.
    """

    def __init__(self, records: Iterable[Mapping[str, Any]], columns: Sequence[str] | None = None) -> None:
        records = list(records)
        if columns is None:
            columns = list(dict.fromkeys(key for record in records for key in record))
        self.columns: list[str] = list(columns)
        self.rows: list[list[Any]] = [[record.get(c) for c in self.columns] for record in records]

    @classmethod
    def _of(cls, columns: list[str], rows: list[list[Any]]) -> Table:
        table = cls([], columns)
        table.rows = rows
        return table

    def __len__(self) -> int:
        return len(self.rows)

    def column(self, name: str) -> list[Any]:
        index = self.columns.index(name)
        return [row[index] for row in self.rows]

    def select(self, columns: Sequence[str]) -> Table:
        """These columns, in this order."""
        indices = [self.columns.index(c) for c in columns]
        return self._of(list(columns), [[row[i] for i in indices] for row in self.rows])

    def drop(self, column: str) -> Table:
        return self.select([c for c in self.columns if c != column])

    def empty(self) -> Table:
        """No rows, the same columns."""
        return self._of(list(self.columns), [])

    def groups(self, by: str, keep: Callable[[list[Any]], bool]) -> dict[Any, Table]:
        """The rows for which ``keep(row)`` is true, a table per value of column ``by`` (in row order)."""
        at = self.columns.index(by)
        found: dict[Any, list[list[Any]]] = {}
        for row in self.rows:
            if keep(row):
                found.setdefault(row[at], []).append(row)
        return {value: self._of(list(self.columns), rows) for value, rows in found.items()}

    def without_empty_columns(self) -> Table:
        """Without the columns whose every value is missing (pandas' ``dropna(axis=1, how="all")``)."""
        kept = [c for i, c in enumerate(self.columns) if not all(missing(row[i]) for row in self.rows)]
        return self.select(kept)

    def kinds(self) -> list[str]:
        return [column_kind([row[i] for row in self.rows]) for i in range(len(self.columns))]

    def to_csv(self, path: str) -> None:
        """The table as pandas' ``to_csv(path, index=False)`` writes it."""
        kinds = self.kinds()
        with open(path, "w", encoding="utf-8", newline="") as out:
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(self.columns)
            writer.writerows([csv_cell(v, k) for v, k in zip(row, kinds, strict=True)] for row in self.rows)

    def shown(self) -> list[list[str]]:
        """Every row's cells as the Markdown and HTML tables show them."""
        kinds = self.kinds()
        return [[shown_cell(v, k) for v, k in zip(row, kinds, strict=True)] for row in self.rows]

    def markdown(self) -> str:
        header = "| " + " | ".join(self.columns) + " |"
        rule = "|" + "---|" * len(self.columns)
        return "\n".join([header, rule, *("| " + " | ".join(cells) + " |" for cells in self.shown())])

    def html(self) -> str:
        """An HTML table (the cells escaped), in the form of pandas' ``to_html(index=False)``."""
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells) + "</tr>\n" for cells in self.shown()
        )
        return (
            f'<table border="1" class="dataframe">\n<thead>\n<tr style="text-align: right;">{head}</tr>\n</thead>\n'
            f"<tbody>\n{body}</tbody>\n</table>"
        )
