"""Reading msprobe's ``dump.json``: that it opens, its entries one at a time (where it is: ``layout.py``).

A statistics dump of a large model at level mix runs to hundreds of MB; ``json.load`` would hold
the whole tree. :func:`entries` holds one entry (and a read buffer) at a time: the top-level fields
(``task``, ``level``, ``dump_data_dir`` …) and each member of ``data`` are decoded separately with
the standard library's decoder. Every reader here raises :class:`DumpFileError`, naming the file;
:class:`DumpProbe` asks many dumps whether they open and what their embedding holds, each once.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

CHUNK = 1 << 20  # characters read at a time
EMBEDDING_CHUNK = 1 << 16  # the embedding entry is within a dump's first few KB: read only that far
TENSOR_FOLDER = "dump_tensor_data"  # beside a tensor-mode dump.json: msprobe's tensor files
_DECODER = json.JSONDecoder()
_SPACE = " \t\r\n"
# The embedding's input holds the token ids: the module (HF/vLLM/SGLang ``embed_tokens``, Megatron
# ``word_embeddings``, any wrapper prefix) at L0/mix, or the functional call at L1/mix.
_EMBEDDING_MODULES = frozenset({"embed_tokens", "word_embeddings"})
_EMBEDDING_API = "Functional.embedding.0.forward"


class DumpFileError(ValueError):
    """A ``dump.json`` that is missing, unreadable or not msprobe's JSON; the message names the file."""


def _open(path: str, chunk: int | None = None) -> _Reader:
    try:
        return _Reader(path, chunk or CHUNK)
    except FileNotFoundError:
        raise DumpFileError(f"{path}: missing") from None
    except OSError as exc:
        raise DumpFileError(f"{path}: unreadable ({exc.strerror})") from None


def check_readable(path: str) -> None:
    """Raise :class:`DumpFileError` unless ``path`` opens and starts as a JSON object."""
    reader = _open(path, 64)
    try:
        if reader.peek() != "{":
            raise DumpFileError(f"{path}: not an msprobe dump.json (expected a JSON object)")
    finally:
        reader.handle.close()


class _Reader:
    def __init__(self, path: str, chunk: int) -> None:
        self.path = path
        self.chunk = chunk
        self.handle = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 -- closed by its callers
        self.buffer = ""
        self.pos = 0
        self.eof = False

    def _more(self) -> bool:
        if self.eof:
            return False
        try:
            piece = self.handle.read(self.chunk)
        except OSError as exc:
            raise DumpFileError(f"{self.path}: unreadable ({exc.strerror})") from None
        if not piece:
            self.eof = True
            return False
        self.buffer = self.buffer[self.pos :] + piece
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


def entries(path: str, chunk: int | None = None) -> Iterator[tuple[str, Any, bool]]:
    """``(key, value, is_data_entry)``: top-level fields (False) and each ``data`` member (True), in file order."""
    reader = _open(path, chunk)
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


def embedding_tokens(path: str) -> int | None:
    """How many tokens the dump's embedding input holds (None: the dump has no embedding entry).

    Training dumps ``[1, T]``, vLLM/SGLang ``[T]``: the product of the shape either way. With
    msprobe's ``request_id`` filter it is that one request's token count. msprobe writes entries in
    call order, so the embedding is among the first: the file is read only up to it.
    """
    for name, entry, is_entry in entries(path, EMBEDDING_CHUNK):
        if is_entry and (name == _EMBEDDING_API or (name.startswith("Module.") and _is_embedding_module(name))):
            try:
                return math.prod(int(n) for n in entry["input_args"][0]["shape"])
            except (KeyError, IndexError, TypeError, ValueError):
                return None
    return None


def _is_embedding_module(name: str) -> bool:
    """``Module.<path>.embed_tokens.<Class>.forward.0``: the module's first call (its class right after it)."""
    head, _, call = name.rpartition(".forward.")
    segments = head.split(".")
    return call == "0" and len(segments) >= 3 and segments[-2] in _EMBEDDING_MODULES


class DumpProbe:
    """Whether dumps open, and their embedding token counts, each file read at most once; a file that fails
    is reported once, through ``warn`` (the message names it)."""

    def __init__(self, warn: Callable[[str], None]) -> None:
        self._warn = warn
        self._readable: set[str] = set()
        self._failed: set[str] = set()
        self._tokens: dict[str, int | None] = {}

    def readable(self, path: str) -> bool:
        """Whether ``path`` opens as a JSON object (:func:`check_readable`)."""
        if path in self._readable:
            return True
        if path in self._failed:
            return False
        try:
            check_readable(path)
        except DumpFileError as exc:
            self._fail(path, exc)
            return False
        self._readable.add(path)
        return True

    def tokens(self, path: str) -> int | None:
        """The dump's :func:`embedding_tokens`; None when unknown (no embedding entry, unreadable)."""
        if path not in self._tokens:
            try:
                self._tokens[path] = embedding_tokens(path)
            except DumpFileError as exc:
                self._tokens[path] = None
                if path not in self._failed:
                    self._fail(path, exc)
        return self._tokens[path]

    def failed(self, path: str) -> bool:
        """Whether reading ``path`` has failed so far (nothing is read now)."""
        return path in self._failed

    def _fail(self, path: str, error: DumpFileError) -> None:
        self._failed.add(path)
        self._warn(str(error))


def tensor_file(dump: str, data_name: str | None) -> str | None:
    """The file of a tensor-mode entry's tensor (``data_name``) beside the ``dump.json`` at ``dump``; None if absent."""
    if not data_name:
        return None
    path = os.path.join(os.path.dirname(dump), TENSOR_FOLDER, data_name)
    return path if os.path.isfile(path) else None


def load_tensor(path: str) -> Any:
    """One dumped tensor (``.pt`` or ``.npy``) as a torch tensor; torch is imported here, on the call, not with the
    module: statistics dumps never need it."""
    import torch

    if path.endswith(".npy"):
        import numpy

        return torch.from_numpy(numpy.load(path))
    return torch.load(path, map_location="cpu", weights_only=True)
