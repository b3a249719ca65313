"""What the training log and the inference dispatch log have in common: their names, the join keys.

Both sides must compute these identically, or ``align`` cannot pair a prefill step with a
training micro-batch, so there is one implementation, here; the readers of ``analysis/`` take the
file names from here too, without importing the runtime that writes them.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterable

# The logs, one file per process under {dump root}/{pid}/, and their ``source`` values (the published recipe's).
TRAINING_LOG = "update_actor_log.jsonl"  # one line per dumped actor micro-batch
TRAINING_SOURCE = "update_actor"
GAP_LOG = "logprob_gap.jsonl"  # beside it: one line per sample of every actor log-prob pass with rollout log-probs
GAP_SOURCE = "logprob_gap"
DISPATCH_LOG = "dispatch_log.jsonl"  # one line per inference model step
# What a training window holds (its log line's "dump"): a micro-batch's forward, one sample's prompt alone
# (PROMPTS_ONLY=1), or one sample's whole sequence (DUMP_SEQUENCES=1).
MICRO_BATCH_WINDOW, PROMPT_WINDOW, SEQUENCE_WINDOW = "micro_batch", "prompt", "sequence"
DISPATCH_SOURCE = "dispatch_logger"

_VLLM_SUFFIX = re.compile(r"^(?P<base>.+)-[0-9a-f]{8}$")


def prompt_hash(token_ids: Iterable[int]) -> str:
    """A short, stable hash of the exact prompt token ids (16 hex digits of SHA-1)."""
    text = ",".join(str(int(t)) for t in token_ids)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def strip_vllm_suffix(request_id: str) -> str:
    """The request id the client sent, from vLLM's internal ``{id}-{8 hex}`` form (vLLM >= 0.14)."""
    match = _VLLM_SUFFIX.match(request_id)
    return match.group("base") if match else request_id


_last_timestamp = (-1, "")  # (epoch second, its text): every dispatch-log line asks, many per second


def clock() -> float:
    """Seconds since the epoch, to the microsecond: the ``time`` field of every log line (the published
    ``timestamp`` has whole seconds only, too coarse to order a rollout against the training step after it)."""
    return round(time.time(), 6)


def timestamp() -> str:
    """Local time, second resolution, as in the published recipe's logs."""
    global _last_timestamp
    second = int(time.time())
    if _last_timestamp[0] != second:  # one tuple assigned at once: safe across threads
        _last_timestamp = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(second)))
    return _last_timestamp[1]
