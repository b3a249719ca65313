"""The dump.json reader streams: it reads a chunk at a time, as its entries are asked for, and holds no more than
a chunk and an entry (a reader that went back to ``json.load``, or kept the text it had read, fails here)."""

from __future__ import annotations

import builtins
import json
import re
import tracemalloc
from pathlib import Path

import pytest

from msprobe_hooks.analysis import dumpfile
from msprobe_hooks.analysis.comparing import compare, names

TEMPLATE = Path(__file__).resolve().parent.parent / "golden" / "verdict" / "bf16-clean" / "generate"
CHUNK = 4096
COPIES = 40  # the template's layers repeated: a dump.json of about 1.8 MB, ~430 chunks
_LAYER = re.compile(r"\.layers\.(\d+)\.")


class _Guarded:
    """A text file that refuses any read but one of at most :data:`CHUNK` characters, counting what it gave."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.given = 0

    def read(self, size: int = -1) -> str:
        assert 0 < size <= CHUNK, f"read({size}): the whole file, or more than a chunk"
        piece = self.handle.read(size)
        self.given += len(piece)
        return piece

    def close(self) -> None:
        self.handle.close()


@pytest.fixture
def big_dump(tmp_path: Path) -> tuple[Path, list[int]]:
    """A dump.json of the template's decoder layers repeated (renumbered), and where each data entry ends."""
    template = json.loads(next(TEMPLATE.glob("*/step0/rank0/dump.json")).read_text())
    data = template.pop("data")
    text = json.dumps(template)[:-1] + ', "data": {'
    ends = []
    layers = 1 + max(int(m.group(1)) for m in map(_LAYER.search, data) if m)
    for copy in range(COPIES):
        for name, entry in data.items():
            if _LAYER.search(name) or not copy:  # further layers, renumbered; the rest once
                name = _LAYER.sub(lambda m, c=copy: f".layers.{c * layers + int(m.group(1))}.", name)
                text += ("," if ends else "") + json.dumps(name) + ": " + json.dumps(entry, indent=1)
                ends.append(len(text))
    text += "}}"
    path = tmp_path / "dump.json"
    path.write_text(text)
    return path, ends


@pytest.fixture
def guarded(monkeypatch) -> list[_Guarded]:
    """Every file the reader opens, guarded; the reader reads :data:`CHUNK` characters at a time."""
    opened: list[_Guarded] = []

    def guarded_open(*args, **kwargs):
        opened.append(_Guarded(builtins.open(*args, **kwargs)))  # noqa: SIM115 -- closed by the reader
        return opened[-1]

    monkeypatch.setattr(dumpfile, "open", guarded_open, raising=False)
    monkeypatch.setattr(dumpfile, "CHUNK", CHUNK)
    return opened


def test_entries_are_read_as_they_are_asked_for(big_dump, guarded):
    path, ends = big_dump
    whole = json.loads(path.read_text())
    seen = 0
    for key, value, is_entry in dumpfile.entries(str(path)):
        if not is_entry:
            assert whole[key] == value
            continue
        # never more of the file than this entry's end and one chunk beyond it
        assert guarded[0].given <= ends[seen] + CHUNK, (seen, guarded[0].given, ends[seen])
        assert whole["data"][key] == value
        seen += 1
    assert seen == len(ends) == len(whole["data"])
    assert guarded[0].given == len(path.read_text())


def test_entries_hold_a_chunk_and_an_entry_not_the_file(big_dump, monkeypatch):
    path, _ = big_dump
    monkeypatch.setattr(dumpfile, "CHUNK", CHUNK)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        count = sum(1 for _ in dumpfile.entries(str(path)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count > 1000
    # json.load holds several times the file; the reader a chunk, an entry and the decoder's own
    assert peak < size / 10, f"{peak} bytes at the peak reading a {size}-byte dump.json"


def test_compare_reads_a_side_through_the_streaming_reader(big_dump, guarded):
    path, _ = big_dump
    side = compare.read_side(str(path), names.load())
    assert guarded and all(handle.given for handle in guarded)  # every read a chunk at most (the guard asserts)
    assert len(side.tensors) > 1000 and side.task


# What read_side may hold per tensor of a dump (kept under a key or not comparable), peak included: packed, about 130
# bytes (side_tensors.py; with the name map's remembered lookups warm, as between pairs). A row object per
# not-comparable tensor (~330 bytes with its name: most tensors here are not comparable), a statistics object per kept
# one (~350), a dumped-name string per tensor (~110) or a dict of parts per key (~230) each takes it past this.
BYTES_PER_TENSOR = 200


def test_compare_holds_a_side_packed_not_as_objects_per_tensor(big_dump, monkeypatch):
    path, _ = big_dump
    monkeypatch.setattr(dumpfile, "CHUNK", CHUNK)  # the reader's own buffer: a chunk, not a share of each tensor
    table = names.load()
    compare.read_side(str(path), table)  # the name map's lookups of these paths, remembered as between pairs
    tracemalloc.start()
    try:
        side = compare.read_side(str(path), table)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    tensors = len(side.tensors) + len(side.not_comparable)
    assert len(side.not_comparable) > 1000 and len(side.tensors) > 1000
    assert peak / tensors < BYTES_PER_TENSOR, f"{peak} bytes at the peak reading {tensors} tensors"
