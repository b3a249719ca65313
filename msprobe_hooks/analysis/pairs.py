"""The ``pairs.jsonl`` file that ``align`` writes and ``compare`` reads: one schema, here.

One line per pair::

    {"pair": 0, "rule": "request_id", "key": "job-3", "prompt_len": 12,
     "train":    {"dump": "...dump.json", "step": 3, "rank": 0, "pid": 811, "log": "...jsonl",
                  "global_step": 1, "micro_batch": 0, "sample": 0, "uid": "u-3", "request_id": "job-3"},
     "generate": {"dump": "...dump.json", "step": 0, "rank": 0, "pid": 912, "log": "...jsonl",
                  "engine": "vllm", "request_id": "job-3-1a2b3c4d", "filtered": false}}

``rule`` says what joined the two sides (``request_id``: the engine's suffix stripped, both sides
carried it; ``prompt_hash``: the hash of the prompt token ids), ``key`` the value it joined on.
``filtered`` is true when the inference step packed several requests and msprobe's
``request_id`` filter cut the dump to this one. Paths are absolute, or relative to the folder of
the pairs file (so a pairs file edited by hand, or moved with its dump trees, still resolves).
Unknown fields are kept: a newer ``align`` may add some.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

RULES = ("request_id", "prompt_hash")
SIDES = ("train", "generate")


class PairsFileError(ValueError):
    """A pairs file line that ``compare`` cannot use; the message names the file and the line."""


def resolve(path: str, pairs_file: str) -> str:
    """A dump path of a pairs line, made absolute against the pairs file's folder."""
    return (
        path
        if os.path.isabs(path)
        else os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(pairs_file)), path))
    )


def write(pairs: Iterable[dict[str, Any]], path: str) -> int:
    """Write ``pairs`` (already in the schema above) to ``path``; returns how many."""
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for pair in pairs:
            out.write(json.dumps(pair, separators=(",", ":"), ensure_ascii=False) + "\n")
            count += 1
    return count


def read(path: str) -> Iterator[dict[str, Any]]:
    """The pairs of ``path``, dump paths resolved; a line that is not a usable pair raises PairsFileError."""
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                pair = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PairsFileError(f"{where}: not JSON ({exc.msg}); expected one pair per line") from None
            if not isinstance(pair, dict):
                raise PairsFileError(f"{where}: a {type(pair).__name__}, expected a JSON object")
            for side in SIDES:
                dump = pair.get(side, {}).get("dump") if isinstance(pair.get(side), dict) else None
                if not isinstance(dump, str) or not dump:
                    raise PairsFileError(f"{where}: no {side}.dump path; each pair names both dump.json files")
                pair[side]["dump"] = resolve(dump, path)
            yield pair
