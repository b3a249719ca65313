"""Reading msprobe's ``dump.json`` one entry at a time.

A statistics dump of a large model at level mix runs to hundreds of MB; ``json.load`` would hold
the whole tree. This reader holds one entry (and a read buffer) at a time: the top-level fields
(``task``, ``level``, ``dump_data_dir`` …) and each member of ``data`` are decoded separately
with the standard library's decoder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

CHUNK = 1 << 20  # characters read at a time
_DECODER = json.JSONDecoder()
_SPACE = " \t\r\n"


class DumpFileError(ValueError):
    """A ``dump.json`` that is not the JSON object msprobe writes; the message names the file."""


class _Reader:
    def __init__(self, path: str) -> None:
        self.path = path
        self.handle = open(path, encoding="utf-8")  # noqa: SIM115 -- closed by entries()
        self.buffer = ""
        self.pos = 0
        self.eof = False

    def _more(self) -> bool:
        if self.eof:
            return False
        chunk = self.handle.read(CHUNK)
        if not chunk:
            self.eof = True
            return False
        self.buffer = self.buffer[self.pos :] + chunk
        self.pos = 0
        return True

    def _error(self, what: str) -> DumpFileError:
        return DumpFileError(f"{self.path}: {what}; expected msprobe's dump.json (a JSON object with a data field)")

    def peek(self) -> str:
        while True:
            while self.pos < len(self.buffer) and self.buffer[self.pos] in _SPACE:
                self.pos += 1
            if self.pos < len(self.buffer):
                return self.buffer[self.pos]
            if not self._more():
                raise self._error("ends early (truncated?)")

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise self._error(f"{self.buffer[self.pos]!r} where {char!r} belongs")
        self.pos += 1

    def separator(self) -> bool:
        """After a member: True when another follows (``,``), False at the end of the object (``}``)."""
        char = self.peek()
        self.pos += 1
        if char not in ",}":
            raise self._error(f"{char!r} between two members")
        return char == ","

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buffer, self.pos)
                # A number at the very end of the buffer may continue in the next chunk.
                if end < len(self.buffer) or self.eof:
                    self.pos = end
                    return value
            except json.JSONDecodeError as exc:
                if self.eof:
                    raise self._error(f"invalid or truncated JSON ({exc.msg})") from None
            self._more()


def entries(path: str) -> Iterator[tuple[str, Any, bool]]:
    """``(key, value, is_data_entry)``: top-level fields (False) and each ``data`` member (True), in file order."""
    reader = _Reader(path)
    try:
        reader.expect("{")
        if reader.peek() == "}":
            return
        while True:
            key = reader.value()
            reader.expect(":")
            if key == "data" and reader.peek() == "{":
                reader.expect("{")
                more = reader.peek() != "}"
                if not more:
                    reader.pos += 1
                while more:
                    name = reader.value()
                    reader.expect(":")
                    yield name, reader.value(), True
                    more = reader.separator()
            else:
                yield key, reader.value(), False
            if not reader.separator():
                return
    finally:
        reader.handle.close()
