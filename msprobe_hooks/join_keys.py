"""What the training log and the inference dispatch log have in common: their names, the join keys.

Both sides must compute these identically, or ``align`` cannot pair a prefill step with a
training micro-batch, so there is one implementation, here; the readers of ``analysis/`` take the
file names from here too, without importing the runtime that writes them.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

# The logs, one file per process under {dump root}/{pid}/, and their ``source`` values (the published recipe's).
TRAINING_LOG = "update_actor_log.jsonl"  # one line per dumped actor micro-batch
TRAINING_SOURCE = "update_actor"
GAP_LOG = "logprob_gap.jsonl"  # beside it: one line per sample of every actor log-prob pass with rollout log-probs
GAP_SOURCE = "logprob_gap"
DISPATCH_LOG = "dispatch_log.jsonl"  # one line per inference model step
ROUTED_EXPERTS_LOG = "routed_experts.jsonl"  # one line per inference model step: the experts each MoE router chose
ENGINE_LOG = "engine.jsonl"  # one line per engine process (training and inference): its numerics settings
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


# The HF configuration fields that change a forward's numbers, written as they are (those a configuration has) in the
# "model_config" of both sides' engine.jsonl lines (both spellings of RoPE's: transformers 5 moved rope_theta and
# rope_scaling into rope_parameters).
MODEL_CONFIG_FIELDS = (
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "rms_norm_eps",
    "layer_norm_eps",
    "tie_word_embeddings",
    "max_position_embeddings",
    "hidden_act",
    "vocab_size",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "attention_bias",
    "final_logit_softcapping",
    "attn_logit_softcapping",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "norm_topk_prob",
)

# The model configuration's fingerprint, written by both sides in engine.jsonl: equal fingerprints, equal numerics
# fields. Left out (at every level of nesting) are the fields that say how a configuration was named, loaded or
# served, and that two engines loading one model set differently without changing a number of the forward:
CONFIG_FINGERPRINT_VERSION = "cfg-v1"
CONFIG_FINGERPRINT_EXCLUDED = frozenset(
    {
        # where it came from and which code reads it
        "_name_or_path",
        "name_or_path",
        "architectures",
        "auto_map",
        "transformers_version",
        "_commit_hash",
        # the dtype it was loaded in and the attention kernel: each engine's numerics say what it computes in
        "torch_dtype",
        "dtype",
        "attn_implementation",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "_attn_implementation_internal",
        "_experts_implementation",
        # what a forward returns, not what it computes
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "output_router_logits",
        "return_dict",
        "use_return_dict",
        "torchscript",
        # verl overwrites these from the tokenizer (HFModelConfig), and turns multi-token prediction layers off
        # (they are not on the path of the main logits)
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "num_nextn_predict_layers",
        "mtp_num_hidden_layers",
        # classification heads' labels
        "id2label",
        "label2id",
        "problem_type",
    }
)


def config_fingerprint(config_dict: Mapping[str, Any]) -> str:
    """``cfg-v1:`` and the SHA-256 of a model configuration's ``to_dict()`` as canonical JSON (sorted keys, no
    spaces), the fields of :data:`CONFIG_FINGERPRINT_EXCLUDED` left out at every level."""
    canonical = json.dumps(_numerics_fields(config_dict), sort_keys=True, separators=(",", ":"), default=str)
    return f"{CONFIG_FINGERPRINT_VERSION}:{hashlib.sha256(canonical.encode()).hexdigest()}"


def _numerics_fields(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _numerics_fields(v) for k, v in value.items() if k not in CONFIG_FINGERPRINT_EXCLUDED}
    if isinstance(value, (list, tuple)):
        return [_numerics_fields(v) for v in value]
    return value
