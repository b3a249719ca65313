"""Cost of ``join_keys.prompt_hash`` per prompt, on both sides as they call it (issue 22, item 6).

For prompts of 2,048 and 32,768 token ids, per hash (median of repeats, microseconds):

* version 1, the decimal text of the ids joined by commas, then SHA-1: reimplemented here only, as the
  reference (the logs of older releases still carry it);
* version 2, ``join_keys.prompt_hash`` (SHA-1 over the ids as little-endian int64);
* the floor: SHA-1 over the ids' bytes, the conversion to bytes included (from a Python list: the faster of
  ``array('q')`` and ``struct.pack``; from a tensor: its int64 memory, no copy).

The inference side hashes a Python list (``inference/dispatch_log.py``'s ``PromptHashes``, SGLang's
``patches/sglang/forward_batch.py``); the training side a slice of a tensor of token ids
(``training/micro_batch.py``): ``join_keys.tensor_prompt_hash`` over its bytes, and, as it called it
before, ``.tolist()`` then ``prompt_hash``. Prints the table and the ratios to the floor; no pass/fail.
"""

from __future__ import annotations

import hashlib
import os
import random
import statistics
import struct
import timeit
from array import array
from collections.abc import Callable, Sequence

import torch

from msprobe_hooks.join_keys import prompt_hash, tensor_prompt_hash

LENGTHS = (2048, 32768)
VOCABULARY = 151_936  # Qwen2.5's: ids of up to six digits, as in a real prompt
REPEATS = 7


def version_1(token_ids: Sequence[int]) -> str:
    """The first definition (logs without ``prompt_hash_version``): SHA-1 of the ids' decimal text."""
    return hashlib.sha1(",".join(str(int(t)) for t in token_ids).encode()).hexdigest()[:16]


def array_floor(token_ids: Sequence[int]) -> str:
    return hashlib.sha1(array("q", token_ids)).hexdigest()


def struct_floor(token_ids: Sequence[int]) -> str:
    return hashlib.sha1(struct.pack(f"<{len(token_ids)}q", *token_ids)).hexdigest()


def tensor_floor(ids: torch.Tensor) -> str:
    return hashlib.sha1(ids.numpy()).hexdigest()


def per_call_us(work: Callable[[], object]) -> float:
    """The median over :data:`REPEATS` rounds of one call's time, in microseconds."""
    calls = max(1, int(0.05 / max(timeit.timeit(work, number=1), 1e-7)))  # rounds of about 50 ms
    return statistics.median(timeit.repeat(work, number=calls, repeat=REPEATS)) / calls * 1e6


def measure(length: int) -> tuple[tuple[float, float, float], tuple[float, float, float], float]:
    """(inference side, training side), each (version 1, version 2, the floor), and the training side's
    ``.tolist()`` then ``prompt_hash``, per hash of ``length`` ids, in microseconds."""
    ids = [random.randrange(VOCABULARY) for _ in range(length)]
    # The training side's tensor: a sample's sequence (prompt and response), cut to its prompt.
    sequence = torch.tensor(ids + [random.randrange(VOCABULARY) for _ in range(length // 4)])
    assert prompt_hash(ids) == tensor_prompt_hash(sequence[:length])  # the two sides must agree (tests check it)
    inference = (
        per_call_us(lambda: version_1(ids)),
        per_call_us(lambda: prompt_hash(ids)),
        min(per_call_us(lambda: array_floor(ids)), per_call_us(lambda: struct_floor(ids))),
    )
    training = (
        per_call_us(lambda: version_1(sequence[:length].tolist())),
        per_call_us(lambda: tensor_prompt_hash(sequence[:length])),
        per_call_us(lambda: tensor_floor(sequence[:length])),
    )
    return inference, training, per_call_us(lambda: prompt_hash(sequence[:length].tolist()))


def main() -> int:
    torch.set_num_threads(1)
    random.seed(0)
    print(f"per prompt hash, microseconds (median of {REPEATS}); load average {os.getloadavg()[0]:.2f}")
    print(f"{'side':<10} {'ids':>6} {'v1':>9} {'v2':>9} {'floor':>8} {'v1/floor':>9} {'v2/floor':>9}")
    for length in LENGTHS:
        inference, training, training_list = measure(length)
        for side, (v1, v2, floor) in (("inference", inference), ("training", training)):
            print(f"{side:<10} {length:>6} {v1:>9.1f} {v2:>9.1f} {floor:>8.1f} {v1 / floor:>8.1f}x {v2 / floor:>8.1f}x")
        print(
            f"{'':<17} training as it called it before, .tolist() then prompt_hash: {training_list:.1f} us "
            f"({training_list / training[2]:.1f}x the floor)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
