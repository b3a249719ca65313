"""What the training log and the inference dispatch log have in common: their names, the join keys.

Both sides must compute these identically, or ``align`` cannot pair a prefill step with a
training micro-batch, so there is one implementation, here; the readers of ``analysis/`` take the
file names from here too, without importing the runtime that writes them.
"""

from __future__ import annotations

import hashlib
import re
import struct
import sys
import time
from collections.abc import Iterable
from typing import Any

# The logs, one file per process under {dump root}/{pid}/, and their ``source`` values (the published recipe's).
TRAINING_LOG = "update_actor_log.jsonl"  # one line per dumped actor micro-batch
TRAINING_SOURCE = "update_actor"
GAP_LOG = "logprob_gap.jsonl"  # beside it: one line per sample of every actor log-prob pass with rollout log-probs
GAP_SOURCE = "logprob_gap"
GAP_TOKEN_DECIMALS = 6  # its per-token log-probs' decimals: 1e-6 is far below any gap worth a diagnosis
DISPATCH_LOG = "dispatch_log.jsonl"  # one line per inference model step
# beside msprobe's dump.json of a dumped inference step, where msprobe left its logits processor out (verl imported)
LOGITS_FILE = "logits.pt"
ROUTED_EXPERTS_LOG = "routed_experts.jsonl"  # one line per inference model step: the experts each MoE router chose
ENGINE_LOG = "engine.jsonl"  # one line per model load: the settings that change numerics (msprobe_hooks.numerics)
REQUESTS_LOG = "requests.jsonl"  # inference, beside the dispatch log: one line per request, its sampling and prompt
# What a training window holds (its log line's "dump"): a micro-batch's forward, one sample's prompt alone
# (PROMPTS_ONLY=1), or one sample's whole sequence (DUMP_SEQUENCES=1).
MICRO_BATCH_WINDOW, PROMPT_WINDOW, SEQUENCE_WINDOW = "micro_batch", "prompt", "sequence"
# Megatron's lines: the global index of the dumped pipeline stage's first decoder layer. msprobe names a
# stage's layers from 0 (``decoder.layers.0`` is layer ``layer_offset`` of the model); compare numbers globally.
LAYER_OFFSET = "layer_offset"
DISPATCH_SOURCE = "dispatch_logger"

_VLLM_SUFFIX = re.compile(r"^(?P<base>.+)-[0-9a-f]{8}$")


# The definition of prompt_hash, written beside the hashes in both logs (field PROMPT_HASH_VERSION_FIELD):
# 1 (logs without the field): SHA-1 of the ids as decimal text joined by commas, ~100 ns a token in Python;
# 2: SHA-1 of the ids as little-endian int64, one pass over a buffer. align joins hashes of one version only.
PROMPT_HASH_VERSION = 2
PROMPT_HASH_VERSION_FIELD = "prompt_hash_version"


def prompt_hash(token_ids: Iterable[int]) -> str:
    """A short, stable hash of the exact prompt token ids: 16 hex digits of SHA-1 over them as little-endian
    int64 (definition :data:`PROMPT_HASH_VERSION`)."""
    ids = token_ids if isinstance(token_ids, (list, tuple)) else list(token_ids)
    return _digest(struct.pack(f"<{len(ids)}q", *ids))  # from a list, faster than array("q"): bench_prompt_hash.py


def tensor_prompt_hash(token_ids: Any) -> str:
    """:func:`prompt_hash` of the ids of a 1-D integer torch tensor (any device), hashed from its int64 memory:
    ``.tolist()`` first would cost several times the hash (``benchmarks/bench_prompt_hash.py``)."""
    ids = token_ids.detach().reshape(-1).cpu().long().contiguous().numpy()
    if sys.byteorder == "big":
        ids = ids.byteswap()
    return _digest(ids)


def _digest(little_endian_int64: Any) -> str:
    return hashlib.sha1(little_endian_int64).hexdigest()[:16]


def versioned_hash(value: str | None, version: int) -> str | None:
    """A logged prompt hash as align joins it: marked with its definition's version from the second on, so
    hashes of two definitions never meet (those of the first, in older logs, stay as they were written)."""
    return value if value is None or version == 1 else f"{value}/v{version}"


def rank_folder(rank: int | None, pid: int | None) -> str:
    """msprobe's folder of a rank under ``step{N}``: ``rank{R}``, ``proc{pid}`` when it knew no rank."""
    return f"rank{rank}" if rank is not None or pid is None else f"proc{pid}"


def strip_vllm_suffix(request_id: str) -> str:
    """The request id the client sent, from vLLM's internal ``{id}-{8 hex}`` form (vLLM >= 0.14)."""
    match = _VLLM_SUFFIX.match(request_id)
    return match.group("base") if match else request_id


_last_timestamp = (-1, "")  # (epoch second, its text): every dispatch-log line asks, many per second


def clock(at: float | None = None) -> float:
    """Seconds since the epoch (``at``, else now), to the microsecond: the ``time`` field of every log line (the
    published ``timestamp`` has whole seconds only, too coarse to order a rollout against the training step
    after it)."""
    return round(time.time() if at is None else at, 6)


def timestamp(at: float | None = None) -> str:
    """Local time (of ``at``, else now), second resolution, as in the published recipe's logs."""
    global _last_timestamp
    second = int(time.time() if at is None else at)
    if _last_timestamp[0] != second:  # one tuple assigned at once: safe across threads
        _last_timestamp = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(second)))
    return _last_timestamp[1]
