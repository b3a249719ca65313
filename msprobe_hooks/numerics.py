"""The settings that change an engine's numerics, as both sides record them: one ``engine.jsonl`` line per model load.

Each process that loads a model writes ``{dump root}/{pid}/engine.jsonl`` (:data:`~msprobe_hooks.join_keys.ENGINE_LOG`)
with what its engine *effectively* runs, read from the engine's own objects (never from what the user passed:
vLLM 0.32 ignores an ``hf_overrides`` ``rope_theta`` under transformers 5)::

    {"side": "generate", "engine": "vllm", "version": "0.32.0", "pid": 4242, "rank": 0, "time": 1778666400.1,
     "numerics": {"model_dtype": "bfloat16", "kv_cache_dtype": "fp8_e4m3", "head_dtype": "float32", ...},
     "model_config": {"rope_theta": 1000000.0, "rope_theta_source": "rotary module", "rms_norm_eps": 1e-06, ...},
     "model_config_fingerprint": "cfg-v1:3f2a..."}

The keys here are shared by the inference and the training side so that a diagnosis compares like with like:
a setting an engine does not have is ``null``, a dtype is named as torch prints it without ``torch.``
(:func:`dtype_name`). This module imports nothing heavy: the writers run in every engine process.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

GENERATE_SIDE = "generate"  # the "side" of an inference engine's line

# The "numerics" keys, in this order on every line (None where the engine has no such setting).
NUMERICS_KEYS = (
    "model_dtype",  # the dtype the model's weights and activations run in
    "kv_cache_dtype",  # the KV cache's element type as the engine names it (vLLM "fp8_e4m3"); "auto" resolved
    "head_dtype",  # the lm_head / logits dtype
    "attention_backend",
    "tensor_parallel",  # sizes, 1 when not parallel
    "pipeline_parallel",
    "expert_parallel",
    "prefix_caching",  # booleans
    "chunked_prefill",
    "eager",
    "quantization",  # the weights' quantization method, None when unquantized
    "logprobs_mode",  # what the returned log-probs are of (vLLM's logprobs_mode; SGLang's own default named alike)
    "max_model_len",
)

# "logprobs_mode" values an SGLang engine line records: what its returned log-probs are of. vLLM's modes are its own
# (its default "raw_logprobs": the raw logits'; "processed_logprobs": after temperature and top-k / top-p / min-p);
# SGLang's default, log_softmax(logits / temperature) with no nucleus applied, is named here.
RAW_LOGPROBS, TEMPERATURE_SCALED_LOGPROBS = "raw_logprobs", "temperature_scaled_logprobs"

# The fields of a model configuration (HF ``config.json``) that change numerics, recorded when the config has them.
# transformers 5 moved rope_theta / rope_scaling into rope_parameters: both spellings are kept as the config has them.
CONFIG_FIELDS = (
    "model_type",
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
    "layer_norm_epsilon",
    "norm_epsilon",
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
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "query_pre_attn_scalar",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
)
# Where the effective rope theta of a model_config line came from (its "rope_theta_source").
ROPE_FROM_MODULE, ROPE_FROM_CONFIG = "rotary module", "config"

CONFIG_FINGERPRINT_VERSION = "cfg-v1"
# Left out of the fingerprint (at every level of nesting): the fields that say how a configuration was named, loaded
# or served, and that two engines loading one model set differently without changing a number of the forward; so the
# same checkpoint read from two paths (the trainer's copy, the rollout's) fingerprints alike.
FINGERPRINT_IGNORED = frozenset(
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

# The sampling parameters of a request line ("sampling"), as vLLM names them (None where the engine has no such).
SAMPLING_KEYS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logprobs",  # how many log-probs per token were asked (None: none)
    "seed",
)


def dtype_name(dtype: Any) -> str | None:
    """A dtype as torch prints it, without ``torch.`` (``torch.bfloat16``: ``"bfloat16"``); None stays None."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items() if k not in FINGERPRINT_IGNORED}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return dtype_name(value)  # a torch.dtype (or anything else) by its printed name


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """``cfg-v1:`` and the SHA-256 of the canonical JSON of a whole model configuration dict (sorted keys, no
    spaces, nested configs included, :data:`FINGERPRINT_IGNORED` left out). Equal fingerprints: the same
    configuration. Different ones may still differ in no numerics field (another transformers release adds keys):
    the ``model_config`` fields say which."""
    text = json.dumps(_canonical(config), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return f"{CONFIG_FINGERPRINT_VERSION}:{hashlib.sha256(text.encode()).hexdigest()}"


def config_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`CONFIG_FIELDS` a configuration dict has, JSON-ready; ``rope_theta`` from ``rope_parameters`` when
    only transformers 5's spelling holds it."""
    fields = {key: _canonical(config[key]) for key in CONFIG_FIELDS if key in config}
    rope = config.get("rope_parameters")
    if fields.get("rope_theta") is None and isinstance(rope, Mapping) and rope.get("rope_theta") is not None:
        fields["rope_theta"] = rope["rope_theta"]
    return fields


def engine_record(
    *,
    side: str,
    engine: str,
    version: str | None,
    pid: int,
    rank: int | None,
    time: float,
    numerics: Mapping[str, Any],
    model_config: Mapping[str, Any],
    fingerprint: str | None,
    tokenizer_fingerprint: str | None = None,
) -> dict[str, Any]:
    """One ``engine.jsonl`` line: ``numerics`` in :data:`NUMERICS_KEYS` order (missing keys null); the tokenizer's
    fingerprint only where the engine could reach its tokenizer (the field is left out, never guessed)."""
    record: dict[str, Any] = {
        "side": side,
        "engine": engine,
        "version": version,
        "pid": pid,
        "rank": rank,
        "time": time,
        "numerics": {key: numerics.get(key) for key in NUMERICS_KEYS},
        "model_config": dict(model_config),
        "model_config_fingerprint": fingerprint,
    }
    if tokenizer_fingerprint is not None:
        record["tokenizer_fingerprint"] = tokenizer_fingerprint
    return record
