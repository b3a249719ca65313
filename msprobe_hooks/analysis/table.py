"""The report's tables without pandas: values under named columns, as CSV, Markdown and HTML.

pandas costs ``compare`` more to import (0.3-0.7 s here) than a few pairs take to compare, so the report does
not use it. The CSV files stay what pandas wrote (``DataFrame(records, columns).to_csv(path, index=False)``),
byte for byte: each column is written as the dtype pandas infers for it (:func:`column_kind`), a missing value
(None, NaN) as an empty cell, quoting by the csv module as pandas does (``tests/analysis/test_table.py``
checks both against pandas). A table is held by column: a report of a thousand pairs has millions of cells,
and a column is formatted in one pass.
"""

from __future__ import annotations

import csv
import enum
import html
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

# The dtype pandas infers for a column of Python values, as far as it changes what a cell says.
INT, FLOAT, BOOL, OBJECT = "int", "float", "bool", "object"
_NONE = type(None)
_CHUNK_ROWS = 1 << 14


def missing(value: Any) -> bool:
    """What pandas counts as missing: None and NaN."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _type_kind(t: type) -> str | None:
    if t is _NONE:
        return None
    if issubclass(t, bool):
        return BOOL
    if issubclass(t, int):
        return INT
    return FLOAT if issubclass(t, float) else OBJECT


def column_kind(values: Sequence[Any]) -> str:
    """The dtype pandas gives a column of these values: integers alone are ``int``; integers and floats, or
    integers with a missing value, ``float`` (so 3 is written 3.0); booleans alone ``bool``; anything else
    ``object`` (each value as its ``str``)."""
    return _kind(set(map(type, values)))


def _kind(types: set[type]) -> str:
    kinds = {_type_kind(t) for t in types}
    present = kinds - {None}
    if present == {INT}:
        return FLOAT if None in kinds else INT
    if present and present <= {INT, FLOAT}:
        return FLOAT  # NaN is a float: integers with a NaN are floats too
    return BOOL if present == {BOOL} and None not in kinds else OBJECT


def csv_cells(values: Sequence[Any], kind: str) -> list[str]:
    """A column as pandas' ``to_csv`` writes it (a column of ``kind``), before the csv module's quoting."""
    types = set(map(type, values))
    if kind == FLOAT:  # numpy's float text is Python's repr
        if types <= {float, _NONE}:
            return ["" if v is None or v != v else repr(v) for v in values]
        return ["" if v is None or v != v else repr(float(v)) for v in values]
    if kind in (INT, BOOL):
        return list(map(str, values))
    if types <= {str, _NONE}:
        return ["" if v is None else v for v in values]
    return ["" if v is None or (isinstance(v, float) and v != v) else str(v) for v in values]


_SPECIAL = (",", '"', "\n", "\r")  # what makes the csv module quote a field (QUOTE_MINIMAL, its default dialect)


def _quoted(cells: list[str]) -> list[str]:
    """The cells as the csv module writes them: in quotes (their own doubled) where they hold a delimiter, a quote
    or a line break."""
    joined = "\0".join(cells)
    if not any(c in joined for c in _SPECIAL):  # most columns: one scan
        return cells
    return [f'"{c.replace(chr(34), chr(34) * 2)}"' if any(s in c for s in _SPECIAL) else c for c in cells]


def csv_header(columns: Sequence[str]) -> str:
    """The header line of a CSV file of these columns (of two or more), as pandas writes it."""
    return ",".join(_quoted(list(columns))) + "\n"


def float_text(value: float) -> str:
    """A float as the report's Markdown and HTML tables show it: three significant digits."""
    return f"{value:.3g}"


def shown_cells(values: Sequence[Any], kind: str) -> list[str]:
    """A column as the report's Markdown and HTML tables show it: floats (a ``float`` column's integers too) to
    three significant digits, missing values empty."""
    if kind == FLOAT:
        return ["" if v is None or v != v else f"{v:.3g}" for v in values]
    if kind in (INT, BOOL):
        return list(map(str, values))
    return ["" if v is None else (f"{v:.3g}" if v == v else "") if isinstance(v, float) else str(v) for v in values]


class Table:
    """Values under named columns, held by column.

    From records: ``columns`` default to every key of the records, in the order they first appear (as pandas
    orders a DataFrame of dicts); a key a record lacks is a missing value. Enum values are their text.
    """

    def __init__(self, records: Iterable[Mapping[str, Any]] = (), columns: Sequence[str] | None = None) -> None:
        records = list(records)
        if columns is None:
            columns = list(dict.fromkeys(key for record in records for key in record))
        self.columns: list[str] = list(columns)
        self._values = [_plain([record.get(c) for record in records]) for c in self.columns]
        self._length = len(records)
        self._kinds: list[str] | None = None

    @classmethod
    def of_columns(cls, columns: Sequence[str], values: Sequence[Sequence[Any]], length: int | None = None) -> Table:
        """A table of these columns' values (each a sequence, one value per row)."""
        table = cls([], columns)
        table._values = [_plain(list(v)) for v in values]
        table._length = len(table._values[0]) if table._values else (length or 0)
        return table

    def __len__(self) -> int:
        return self._length

    def column(self, name: str) -> list[Any]:
        return self._values[self.columns.index(name)]

    def select(self, columns: Sequence[str]) -> Table:
        """These columns, in this order."""
        return self.of_columns(columns, [self.column(c) for c in columns], self._length)

    def drop(self, column: str) -> Table:
        return self.select([c for c in self.columns if c != column])

    def take(self, rows: Sequence[int]) -> Table:
        """These rows, in this order."""
        return self.of_columns(self.columns, [[values[i] for i in rows] for values in self._values], len(rows))

    def without_empty_columns(self) -> Table:
        """Without the columns whose every value is missing (pandas' ``dropna(axis=1, how="all")``)."""
        return self.select([c for c, v in zip(self.columns, self._values, strict=True) if not all(map(missing, v))])

    def kinds(self) -> list[str]:
        if self._kinds is None:
            self._kinds = [_kind(set(map(type, v))) for v in self._values]
        return self._kinds

    def to_csv(self, path: str, kinds: Sequence[str] | None = None) -> None:
        """The table as pandas' ``to_csv(path, index=False)`` writes it; ``kinds``: the columns' kinds, when
        fixed beforehand (default: what pandas infers from the values)."""
        with open(path, "w", encoding="utf-8", newline="") as out:
            if len(self.columns) < 2:  # the csv module itself: its rules for a row of one field (an empty one is "")
                cells = [csv_cells(v, k) for v, k in zip(self._values, kinds or self.kinds(), strict=True)]
                writer = csv.writer(out, lineterminator="\n")
                writer.writerow(self.columns)
                writer.writerows(zip(*cells, strict=True) if cells else [[]] * len(self))
                return
            out.write(csv_header(self.columns))
            for chunk in self._csv_chunks(kinds):  # the file is written as it is made
                out.write(chunk)

    def csv_body(self, kinds: Sequence[str] | None = None) -> str:
        """The rows of :meth:`to_csv`, without the header (for a file written a table at a time)."""
        return "".join(self._csv_chunks(kinds))

    def _csv_chunks(self, kinds: Sequence[str] | None) -> Iterator[str]:
        kinds = kinds or self.kinds()
        cells = [csv_cells(v, k) for v, k in zip(self._values, kinds, strict=True)]
        cells = [_quoted(c) if k == OBJECT else c for c, k in zip(cells, kinds, strict=True)]
        rows = zip(*cells, strict=True)
        while chunk := list(itertools.islice(rows, _CHUNK_ROWS)):
            yield "\n".join(map(",".join, chunk)) + "\n"

    def shown(self) -> list[list[str]]:
        """Every row's cells as the Markdown and HTML tables show them."""
        cells = [shown_cells(v, k) for v, k in zip(self._values, self.kinds(), strict=True)]
        return [list(row) for row in zip(*cells, strict=True)] if cells else [[] for _ in range(self._length)]

    def markdown(self) -> str:
        header = "| " + " | ".join(self.columns) + " |"
        rule = "|" + "---|" * len(self.columns)
        return "\n".join([header, rule, *("| " + " | ".join(cells) + " |" for cells in self.shown())])

    def html(self) -> str:
        """An HTML table (the cells escaped), in the form of pandas' ``to_html(index=False)``."""
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        kinds = self.kinds()
        cells = [
            shown_cells(v, k) if k != OBJECT else list(map(html.escape, shown_cells(v, k)))
            for v, k in zip(self._values, kinds, strict=True)
        ]
        body = "".join("<tr><td>" + "</td><td>".join(row) + "</td></tr>\n" for row in zip(*cells, strict=True))
        return (
            f'<table border="1" class="dataframe">\n<thead>\n<tr style="text-align: right;">{head}</tr>\n</thead>\n'
            f"<tbody>\n{body}</tbody>\n</table>"
        )


def _plain(values: list[Any]) -> list[Any]:
    """Enum values as their text (a report's statuses and verdicts)."""
    if any(issubclass(t, enum.Enum) for t in set(map(type, values))):
        return [v.value if isinstance(v, enum.Enum) else v for v in values]
    return values
