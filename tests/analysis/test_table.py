"""The report's tables without pandas write what pandas wrote: CSV byte for byte, the same cells in Markdown."""

from __future__ import annotations

import io
import math
import random
from collections import Counter

import pandas
import pytest

from msprobe_hooks.analysis.comparing.row_store import RowStore, pack
from msprobe_hooks.analysis.report import writer as report
from msprobe_hooks.analysis.report.plots import plain_power
from msprobe_hooks.analysis.results import MODULE_COLUMNS, ModuleRow, PairResult, Status, Unpaired, Verdict
from msprobe_hooks.analysis.table import BOOL, FLOAT, INT, OBJECT, Table, column_kind
from msprobe_hooks.cli.align import unpaired_table

# Columns of every kind pandas tells apart, with the values that change a cell: missing ones, 3 against 3.0,
# floats of every magnitude, text that needs quoting.
COLUMNS = {
    "ints": [0, 7, -3, 2**40],
    "ints_missing": [1, None, 1234, 5],
    "floats": [0.1, 1e-06, 1.2345678901234567e-05, 1e16],
    "floats_nan": [math.nan, 2.5, -0.0, math.inf],
    "ints_and_floats": [1, 2.5, 3, 1e300],
    "bools": [True, False, True, True],
    "bools_missing": [True, None, False, None],
    "bools_and_ints": [True, 1, 0, False],
    "text": ["plain", 'with "quotes"', "a,comma", "two\nlines"],
    "text_missing": [None, "", "x", None],
    "mixed": ["a", 1, 2.5, None],
    "nothing": [None, None, None, None],
    "nan_only": [math.nan, math.nan, math.nan, math.nan],
}


def _records(columns: dict[str, list]) -> list[dict]:
    count = len(next(iter(columns.values())))
    return [{name: values[i] for name, values in columns.items()} for i in range(count)]


def _pandas_csv(records: list[dict], columns: list[str] | None = None) -> str:
    buffer = io.StringIO()
    pandas.DataFrame(records, columns=columns).to_csv(buffer, index=False)
    return buffer.getvalue()


def _ours_csv(table: Table, tmp_path) -> str:
    path = tmp_path / "table.csv"
    table.to_csv(str(path))
    return path.read_text(encoding="utf-8")


def test_every_kind_of_column_is_written_as_pandas_writes_it(tmp_path):
    records = _records(COLUMNS)
    assert _ours_csv(Table(records), tmp_path) == _pandas_csv(records)
    for name in COLUMNS:  # each column alone too: its kind is its own
        assert _ours_csv(Table(records, [name]), tmp_path) == _pandas_csv(records, [name]), name


def test_the_kinds_are_pandas_dtypes():
    frame = pandas.DataFrame(_records(COLUMNS))
    expected = {"i": INT, "f": FLOAT, "b": BOOL}
    for name, values in COLUMNS.items():
        assert column_kind(values) == expected.get(frame[name].dtype.kind, OBJECT), name


def test_random_records_with_keys_missing_and_columns_chosen(tmp_path):
    rng = random.Random(0)
    pool = [None, math.nan, 0, 1, -17, 3.0, 0.5, 1e-9, 123456.789, True, False, "s", 'q"uote', ""]
    for _ in range(200):
        keys = [f"c{i}" for i in range(rng.randint(1, 4))]
        records = [{k: rng.choice(pool) for k in keys if rng.random() < 0.8} for _ in range(rng.randint(0, 5))]
        assert _ours_csv(Table(records), tmp_path) == _pandas_csv(records), records
        assert _ours_csv(Table(records, keys), tmp_path) == _pandas_csv(records, keys), records


def test_markdown_cells_are_the_old_reports(tmp_path):
    """summary.md's tables: what the report printed from a DataFrame (floats to three digits, NaN empty)."""
    records = _records(COLUMNS)
    frame = pandas.DataFrame(records)
    cells = frame.map(lambda v: "" if pandas.isna(v) else f"{v:.3g}" if isinstance(v, float) else str(v))
    expected = [list(row) for row in cells.itertuples(index=False)]
    assert Table(records).shown() == expected


def test_empty_columns_are_dropped_as_pandas_drops_them():
    records = _records(COLUMNS)
    kept = pandas.DataFrame(records).dropna(axis=1, how="all").columns.tolist()
    assert Table(records).without_empty_columns().columns == kept
    assert "nothing" not in kept and "text_missing" in kept


@pytest.mark.parametrize("failed", [False, True])
def test_the_report_tables_are_pandas_tables_of_the_rows(tmp_path, failed):
    """modules.csv and pairs.csv of real-looking rows (the results out of pair order, as a pool returns them); the
    column kinds of modules.csv are fixed by the row type, and come out as pandas infers them for the whole file."""
    rows = [
        ModuleRow(pair=p, order=o, layer=None if o == 0 else o // 10, module=f"layers.{o // 10}.mlp", io="output",
                  status=Status.COMPARED if o % 3 else Status.NOT_COMPARABLE, error=o * 1e-7 or None,
                  diverges=bool(o % 3) and o > 20, reason=None if o % 3 else "rotary, see docs")
        for p in (1, 0) for o in (30, 0, 11, 21)
    ]  # fmt: skip
    results = [
        PairResult(pair=1, rule="request_id", key="req-1", verdict=Verdict.DIVERGES, first_error=0.047, compared=3),
        PairResult(pair=0, rule="prompt_hash", key="ab/v2", verdict=Verdict.FAILED if failed else Verdict.NO_DIVERGENCE,
                   message="cannot read a dump: x" if failed else None),
    ]  # fmt: skip
    with RowStore(str(tmp_path)) as store:  # each pair's lines written alone, pair 1 first
        for pair in (1, 0):
            store.add(pack(pair, [r for r in rows if r.pair == pair]))
        store.write_csv(str(tmp_path / "modules.csv"))
        assert [(r.pair, r.order) for r in store.rows([1])] == [(1, o) for o in (30, 0, 11, 21)]
    frame = pandas.DataFrame([r.record() for r in rows], columns=list(MODULE_COLUMNS))
    expected = io.StringIO()
    frame.sort_values(["pair"], kind="stable").to_csv(expected, index=False)
    assert (tmp_path / "modules.csv").read_text(encoding="utf-8") == expected.getvalue()
    assert list(tmp_path.iterdir()) == [tmp_path / "modules.csv"]  # the store's own files are gone
    pair_table = report.pair_table(results)
    ordered = sorted(results, key=lambda r: r.pair)
    pairs_csv = _pandas_csv([r.record() for r in ordered], pair_table.columns)
    assert _ours_csv(pair_table, tmp_path) == pairs_csv
    assert ("message" in pair_table.columns) == failed


def test_log_axis_labels_in_plain_text():
    assert plain_power(r"$\mathdefault{10^{-6}}$") == "10⁻⁶"
    assert plain_power(r"$\mathdefault{2\times10^{-3}}$") == "2×10⁻³"
    assert plain_power(r"$\mathdefault{10^{0}}$") == "10⁰"
    assert plain_power("") == ""
    assert plain_power(r"$\mathdefault{\sqrt{2}}$") == r"$\mathdefault{\sqrt{2}}$"  # not a power: left to mathtext


def test_aligns_unpaired_table_is_what_pandas_printed():
    """``align``'s unpaired dumps by reason, laid out as ``DataFrame.to_string`` laid them out."""
    rng = random.Random(0)
    for _ in range(100):
        train, generate = (Counter({r: rng.choice([0, 0, 1, 12, 10**6]) for r in Unpaired}) for _ in range(2))
        reasons = [r for r in Unpaired if train[r] or generate[r]]
        if not reasons:
            continue
        frame = pandas.DataFrame(
            {"training dumps": [train[r] for r in reasons], "generate dumps": [generate[r] for r in reasons]},
            index=[r.value for r in reasons],
        )
        assert unpaired_table(train, generate) == frame.to_string()
