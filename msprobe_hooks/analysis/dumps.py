"""What ``align`` needs from an msprobe ``dump.json``: where it is, that it opens, how many tokens it holds.

A dump can be hundreds of MB; the token count comes from its embedding entry, near the top
(msprobe writes entries in call order, a module after its children), found by reading the file
a chunk at a time and decoding that one entry alone.
"""

from __future__ import annotations

import json
import math
import os
import re

DUMP_FILE = "dump.json"
_CHUNK = 1 << 16  # the embedding entry is within the first few KB of a dump
_OVERLAP = 4096  # longer than any entry name: a name cut by a chunk boundary is found in the next
# The embedding's input holds the token ids: the module (HF/vLLM/SGLang ``embed_tokens``, Megatron
# ``word_embeddings``, any wrapper prefix) at L0/mix, or the functional call at L1/mix.
_EMBEDDING_ENTRY = re.compile(
    r'"(Module\.[^"]*?\.(?:embed_tokens|word_embeddings)\.[^".]+\.forward\.0|Functional\.embedding\.0\.forward)"\s*:'
)


class DumpUnreadable(Exception):
    """A dump.json that is missing, unreadable or not msprobe's JSON; the message names the file."""


def dump_path(root: str, step: int, rank: int | None, pid: int | None) -> str:
    """msprobe's ``{root}/step{N}/rank{R}/dump.json`` (``proc{pid}`` when it knew no rank)."""
    leaf = f"rank{rank}" if rank is not None or pid is None else f"proc{pid}"
    return os.path.join(root, f"step{step}", leaf, DUMP_FILE)


def check_readable(path: str) -> None:
    """Raise :class:`DumpUnreadable` unless ``path`` opens and starts as a JSON object."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            start = handle.read(64).lstrip()
    except FileNotFoundError:
        raise DumpUnreadable(f"{path}: missing") from None
    except OSError as exc:
        raise DumpUnreadable(f"{path}: unreadable ({exc.strerror})") from None
    if not start.startswith("{"):
        raise DumpUnreadable(f"{path}: not an msprobe dump.json (expected a JSON object)")


def embedding_tokens(path: str) -> int | None:
    """How many tokens the dump's embedding input holds (None: the dump has no embedding entry).

    Training dumps ``[1, T]``, vLLM/SGLang ``[T]``: the product of the shape either way. With
    msprobe's ``request_id`` filter it is that one request's token count.
    """
    decoder = json.JSONDecoder()
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            buffer = ""
            while True:
                piece = handle.read(_CHUNK)
                buffer += piece
                match = _EMBEDDING_ENTRY.search(buffer)
                if match is not None:
                    return _shape_tokens(_decode_at(decoder, buffer, match.end(), handle, path))
                if not piece:
                    return None
                buffer = buffer[-_OVERLAP:]
    except FileNotFoundError:
        raise DumpUnreadable(f"{path}: missing") from None
    except OSError as exc:
        raise DumpUnreadable(f"{path}: unreadable ({exc.strerror})") from None


def _decode_at(decoder: json.JSONDecoder, buffer: str, start: int, handle, path: str) -> object:
    """The JSON value at ``start`` of ``buffer``, reading more of ``handle`` while it is incomplete."""
    while True:
        rest = buffer[start:]
        begin = start + len(rest) - len(rest.lstrip())
        try:
            return decoder.raw_decode(buffer, begin)[0]
        except json.JSONDecodeError as exc:
            more = handle.read(_CHUNK)
            if not more:
                raise DumpUnreadable(f"{path}: not valid JSON ({exc.msg}; truncated?)") from None
            buffer += more


def _shape_tokens(entry: object) -> int | None:
    try:
        shape = entry["input_args"][0]["shape"]  # type: ignore[index]
        return math.prod(int(n) for n in shape)
    except (KeyError, IndexError, TypeError, ValueError):
        return None
