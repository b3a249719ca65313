"""What each side recorded about itself, put as the diagnosis compares it (:class:`.diagnosis.Evidence`).

The hooks record, from the engines' own objects: each engine's settings and effective model configuration
(``engine.jsonl``, both sides), each rollout request's sampling parameters and prompt token ids
(``requests.jsonl``), and per training sample the temperature its log-probs were recomputed with and, under
``MSPROBE_HOOKS_GAP_TOKENS``, the token ids it was fed (``logprob_gap.jsonl``). A side that recorded nothing of a
kind leaves it None ("not recorded"): no rule decides on it.

The sampling evidence is the transform each side's log-probs are of, not the parameters as passed: vLLM returns
the log-probs of the processed distribution (``logprobs_mode`` ``processed_logprobs``: logits / temperature,
renormalised over the top-k / top-p / min-p set) or of the raw logits (``raw_logprobs``, vLLM's default: the
parameters then change nothing returned); SGLang by default those of logits / temperature, no nucleus applied
(``temperature_scaled_logprobs``); verl recomputes ``log_softmax(logits / temperature)`` and never replays a
nucleus.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from msprobe_hooks.analysis.answer.diagnosis import Evidence, SideEvidence
from msprobe_hooks.analysis.comparing.logits import Transform, claimed
from msprobe_hooks.analysis.pairing.pairs import Pair
from msprobe_hooks.analysis.pairing.side_logs import engine_settings
from msprobe_hooks.join_keys import strip_vllm_suffix

# Model-configuration keys that say where a value came from, not what it is: never compared.
NOT_COMPARED = frozenset({"rope_theta_source"})
# The log-probs transform's fields, as both sides' evidence names them.
TEMPERATURE, TOP_K, TOP_P, MIN_P = "log-probs temperature", "top_k", "top_p", "min_p"
UNTRANSFORMED = {TEMPERATURE: 1.0, TOP_K: None, TOP_P: 1.0, MIN_P: 0.0}


def gather(
    pairs: Sequence[Pair],
    gaps: Mapping[tuple[str, Any], Mapping[str, Any]],
    asked: Mapping[str, Mapping[str, Any]],
) -> Evidence:
    """Both sides' evidence for ``pairs``, from the logs they name, the training side's gap lines (``gaps``:
    :func:`.symptom.read_gaps`) and the rollout's request lines (``asked``: :func:`..pairing.side_logs.requests`)."""
    train_engines = engine_settings(p.train.engine_log for p in pairs)
    generate_engines = engine_settings(p.generate.engine_log for p in pairs)
    keys = [(strip_vllm_suffix(p.generate.request_id or p.key), strip_vllm_suffix(p.key)) for p in pairs]
    sent = {train_key: asked[base] for base, train_key in keys if base in asked}
    samples = {key: line for (key, _), line in gaps.items() if key in {k for _, k in keys}}
    mode = _numerics(generate_engines).get("logprobs_mode")
    return Evidence(
        training=SideEvidence(
            configuration=_configuration(train_engines),
            sampling=_merged(
                {**UNTRANSFORMED, TEMPERATURE: line.get("temperature")}
                for line in samples.values()
                if line.get("temperature") is not None
            ),
            token_ids=_token_ids(samples) or None,
            numerics=_numerics(train_engines) or None,
        ),
        rollout=SideEvidence(
            configuration=_configuration(generate_engines),
            sampling=_merged(_rollout_transform(r.get("sampling") or {}, mode) for r in sent.values())
            if mode is not None
            else None,
            token_ids={k: r["prompt_token_ids"] for k, r in sent.items() if r.get("prompt_token_ids") is not None}
            or None,
            numerics=_numerics(generate_engines) or None,
        ),
    )


def _numerics(engines: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return dict(engines[0].get("numerics") or {}) if engines else {}


def _configuration(engines: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The effective model configuration of a side's first engine, rope_parameters (transformers 5) spelt out as the
    older top-level fields, so that either spelling meets the other."""
    if not engines or not isinstance(engines[0].get("model_config"), Mapping):
        return None
    config = dict(engines[0]["model_config"])
    rope = config.pop("rope_parameters", None)
    if isinstance(rope, Mapping):
        for key, value in rope.items():
            config.setdefault(key if key.startswith("rope_") else f"rope_{key}", value)
    return {k: v for k, v in config.items() if k not in NOT_COMPARED}


def _rollout_transform(sampling: Mapping[str, Any], mode: Any) -> dict[str, Any]:
    """What the rollout's returned log-probs are of, by its log-probs mode and a request's parameters."""
    transform = claimed(sampling, mode) or Transform()
    return {
        TEMPERATURE: transform.temperature,
        TOP_K: transform.top_k,
        TOP_P: transform.top_p,
        MIN_P: transform.min_p,
    }


def _merged(transforms: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """One mapping for a side: each field's value where its requests agree, else their sorted distinct values."""
    found: dict[str, list[Any]] = {}
    for transform in transforms:
        for key, value in transform.items():
            if value not in found.setdefault(key, []):
                found[key].append(value)
    if not found:
        return None
    return {k: v[0] if len(v) == 1 else tuple(sorted(v, key=str)) for k, v in found.items()}


def _token_ids(samples: Mapping[str, Mapping[str, Any]]) -> dict[str, list[int]]:
    """Per sample the prompt's token ids the training forward was fed (its recorded ids up to ``prompt_len``)."""
    found = {}
    for key, line in samples.items():
        ids, prompt = line.get("token_ids"), line.get("prompt_len")
        if isinstance(ids, list) and isinstance(prompt, int):
            found[key] = ids[:prompt]
    return found
