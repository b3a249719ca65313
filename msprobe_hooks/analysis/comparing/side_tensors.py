"""One side's tensors as compare holds them between reading a ``dump.json`` and comparing it: packed in arrays.

A large dump holds hundreds of thousands of module tensors and more that are not comparable. Held as objects (a
statistics object, a dict of parts, a dumped name and a row per tensor) they took about 1 kB each, near what
``json.load`` takes of the file; packed here they take about 150 bytes: a tensor's dumped name is its entry's name
(held once per entry) and its label, what it is (label, shape, dtype and fused part; or label, reason and shape) a
number into the few such a dump repeats layer after layer, and its statistics four doubles in an array.
:class:`SideTensor` and :class:`Stats` are made from them when a key is looked up and compared.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

from msprobe_hooks.analysis.comparing.statistics import DUMPED_STATISTICS, Stats, number
from msprobe_hooks.analysis.results import ModuleRow, Status

Value = TypeVar("Value", bound=Hashable)
Key = TypeVar("Key", bound=Hashable)

_NO_LAYER = -1  # a tensor outside the decoder layers


class Numbered(Generic[Value]):
    """Distinct values, numbered in the order first seen."""

    def __init__(self) -> None:
        self.values: list[Value] = []
        self._numbers: dict[Value, int] = {}

    def number(self, value: Value) -> int:
        found = self._numbers.get(value)
        if found is None:
            found = self._numbers[value] = len(self.values)
            self.values.append(value)
        return found


class DumpedNames:
    """The names of one dump's entries, one after another in one buffer (UTF-8), by the order they were added."""

    def __init__(self) -> None:
        self._names = bytearray()
        self._ends = array("Q")  # where each name ends in _names

    def add(self, name: str) -> int:
        self._names += name.encode("utf-8", "surrogatepass")  # JSON escapes may decode to lone surrogates
        self._ends.append(len(self._names))
        return len(self._ends) - 1

    def tensor_name(self, entry: int, label: str) -> str:
        """The dumped name of the tensor ``label`` (``output.0``) of entry number ``entry``."""
        name = self._names[self._ends[entry - 1] if entry else 0 : self._ends[entry]]
        return f"{name.decode('utf-8', 'surrogatepass')}.{label}"


class KeptTensors:
    """The tensors of one dump that go under a key, by index: entry, order, what they are (label, shape, dtype, fused
    part: numbered, a dump repeats a few per layer) and statistics."""

    def __init__(self, entries: DumpedNames) -> None:
        self.entries = entries
        self._entry = array("I")
        self.order = array("I")  # 2 * the entry's position + 1 for an output: below 2**32 for any dump that fits a disk
        self._described = array("I")
        self._descriptions: Numbered[tuple[str, tuple[int, ...], str, int | None]] = Numbered()
        self._statistics = array("d")  # DUMPED_STATISTICS of each tensor in turn; 0 where missing
        self._missing = array("B")  # bit i: statistic i missing (None)
        self._data_names: dict[int, str] = {}  # tensor mode: the tensor's file, by index

    def add(self, entry: int, label: str, order: int, part: int | None, tensor: Mapping[str, Any]) -> int:
        """Keep ``tensor``, a tensor entry of ``dump.json``: ``{"type": "torch.Tensor", "shape": ..., "Max": ...}``."""
        index = len(self.order)
        self._entry.append(entry)
        self.order.append(order)
        shape = tuple(int(d) for d in tensor.get("shape") or ())
        self._described.append(self._descriptions.number((label, shape, str(tensor.get("dtype", "")), part)))
        missing = 0
        for bit, statistic in enumerate(DUMPED_STATISTICS):
            value = number(tensor.get(statistic))
            missing |= (value is None) << bit
            self._statistics.append(0.0 if value is None else value)
        self._missing.append(missing)
        data_name = tensor.get("data_name")
        if data_name is not None:
            self._data_names[index] = data_name
        return index

    def name(self, index: int) -> str:
        label, _, _, _ = self._descriptions.values[self._described[index]]
        return self.entries.tensor_name(self._entry[index], label)

    def part(self, index: int) -> int | None:
        return self._descriptions.values[self._described[index]][3]

    def stats(self, index: int) -> Stats:
        _, shape, dtype, _ = self._descriptions.values[self._described[index]]
        missing = self._missing[index]
        count = len(DUMPED_STATISTICS)
        values = [None if missing >> bit & 1 else self._statistics[count * index + bit] for bit in range(count)]
        return Stats(shape, dtype, *values)

    def data_name(self, index: int) -> str | None:
        return self._data_names.get(index)


class SideTensor(NamedTuple):
    """One canonical key on one side: a tensor, or the parts of a fused one (indexes into ``kept``, as filed); made
    when a key is looked up."""

    kept: KeptTensors
    alias: bool
    indexes: tuple[int, ...]

    @property
    def order(self) -> int:
        return self.kept.order[self.indexes[0]]

    @property
    def parts(self) -> list[int | None]:
        """The fused parts held (``[None]``: not fused)."""
        return [self.kept.part(i) for i in self.indexes]

    def _in_part_order(self) -> list[int]:
        return sorted(self.indexes, key=lambda i: self.kept.part(i) or 0) if len(self.indexes) > 1 else [*self.indexes]

    def in_order(self) -> list[tuple[str, Stats, str | None]]:
        """(dumped name, statistics, tensor file's name in tensor mode) of each part, in part order."""
        kept = self.kept
        return [(kept.name(i), kept.stats(i), kept.data_name(i)) for i in self._in_part_order()]

    @property
    def name(self) -> str:
        return " + ".join(self.kept.name(i) for i in self._in_part_order())


class SideTensors(Mapping[Key, SideTensor]):
    """Keys to :class:`SideTensor`, held as the index of each key's first tensor, the keys that are aliases and the
    other parts of fused keys beside it."""

    def __init__(self, kept: KeptTensors) -> None:
        self.kept = kept
        self._first: dict[Key, int] = {}
        self._aliases: set[Key] = set()
        self._more_parts: dict[Key, list[int]] = {}

    def file(self, key: Key, index: int, alias: bool) -> bool:
        """File tensor ``index`` under ``key``: a new key, or a part of the one held; False: it goes nowhere (the key
        holds a tensor already; an alias never displaces a primary key's)."""
        if key not in self._first or (key in self._aliases and not alias):
            self._start(key, index, alias)
            return True
        part = self.kept.part(index)
        if (key in self._aliases) != alias or part is None or part in self[key].parts:
            return False
        self._more_parts.setdefault(key, []).append(index)
        return True

    def file_as(self, key: Key, held: SideTensor) -> None:
        """``held`` (another key's) under ``key`` too, unless ``key`` holds one already."""
        if key not in self._first:
            self._start(key, held.indexes[0], held.alias)
            if len(held.indexes) > 1:
                self._more_parts[key] = list(held.indexes[1:])

    def _start(self, key: Key, index: int, alias: bool) -> None:
        self._first[key] = index
        self._more_parts.pop(key, None)
        if alias:
            self._aliases.add(key)
        else:
            self._aliases.discard(key)

    def __getitem__(self, key: Key) -> SideTensor:
        return SideTensor(self.kept, key in self._aliases, (self._first[key], *self._more_parts.get(key, ())))

    def get(self, key: Key, default: Any = None) -> Any:  # noqa: ANN401  (Mapping's, without its exception)
        return self[key] if key in self._first else default

    def __contains__(self, key: object) -> bool:
        return key in self._first

    def __iter__(self) -> Iterator[Key]:
        return iter(self._first)

    def __len__(self) -> int:
        return len(self._first)


class NotComparable(Sequence[tuple[int, int | None, str, str, str]]):
    """The tensors of one dump with a reason instead of a key: ``(order, layer, dumped name, reason, shape)``."""

    def __init__(self, entries: DumpedNames) -> None:
        self.entries = entries
        self._order = array("I")  # as KeptTensors.order
        self._layer = array("i")
        self._entry = array("I")
        self._described = array("I")
        self._descriptions: Numbered[tuple[str, str, str]] = Numbered()  # (label, reason, shape): a few per dump

    def add(self, order: int, layer: int | None, entry: int, label: str, reason: str, shape: str) -> None:
        self._order.append(order)
        self._layer.append(_NO_LAYER if layer is None else layer)
        self._entry.append(entry)
        self._described.append(self._descriptions.number((label, reason, shape)))

    def __getitem__(self, index: int) -> tuple[int, int | None, str, str, str]:  # type: ignore[override]
        layer = self._layer[index]
        label, reason, shape = self._descriptions.values[self._described[index]]
        name = self.entries.tensor_name(self._entry[index], label)
        return self._order[index], None if layer == _NO_LAYER else layer, name, reason, shape

    def __len__(self) -> int:
        return len(self._order)

    def rows(self, order_from: int, inference: bool) -> Iterator[ModuleRow]:
        """Each as a row of the pair, its order after ``order_from``, its name and shape under the side's columns."""
        for order, layer, name, reason, shape in self:
            row = ModuleRow(
                pair=None, order=order_from + order, layer=layer, module="", io="", status=Status.NOT_COMPARABLE
            )
            row.reason = reason
            if inference:
                row.generate_name, row.generate_shape = name, shape
            else:
                row.train_name, row.train_shape = name, shape
            yield row
