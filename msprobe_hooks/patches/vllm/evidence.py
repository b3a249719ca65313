"""What a vLLM runner effectively runs and each new request asked for: the values of engine.jsonl and requests.jsonl.

The files are :mod:`msprobe_hooks.inference.evidence`'s.

Read once the model is loaded (the runner's first step, and the first after a reload), from the runner's
``model_config`` / ``cache_config`` / ``parallel_config`` / ``scheduler_config``, its attention groups and the
loaded model's modules: the lm_head dtype the logits processor applies, the base each rotary module computes
with (vLLM 0.32 under transformers 5 reads rope from ``rope_parameters``, whatever ``hf_overrides`` set at the
top level).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from msprobe_hooks.inference.dispatch_log import current_rank
from msprobe_hooks.inference.evidence import read_settings, report_unread, request_line
from msprobe_hooks.join_keys import ENGINE_LOG, clock
from msprobe_hooks.jsonl import current_pid
from msprobe_hooks.numerics import (
    GENERATE_SIDE,
    ROPE_FROM_CONFIG,
    ROPE_FROM_MODULE,
    SAMPLING_KEYS,
    config_fields,
    config_fingerprint,
    dtype_name,
    engine_record,
)
from msprobe_hooks.patches.vllm.batch import not_eager
from msprobe_hooks.patches.vllm.runner_state import VllmRunner


def describe_engine(state: VllmRunner, runner: Any) -> None:
    """One ``engine.jsonl`` line: the settings that change numerics, read from the runner and its loaded model."""
    state.described = (getattr(runner, "model", None), runner.model_config)  # once, even if reading fails
    model = runner.get_model()
    failures: list[str] = []
    fields, fingerprint = model_configuration(runner, model, failures)
    record = engine_record(
        side=GENERATE_SIDE,
        engine=state.engine,
        version=state.engine_version,
        pid=current_pid(),
        rank=state.rank if state.rank is not None else current_rank(),
        time=clock(),
        numerics=numerics(runner, model, failures),
        model_config=fields,
        fingerprint=fingerprint,
    )
    state.evidence_logs().write_engine(record)
    report_unread(ENGINE_LOG, failures)


def record_requests(state: VllmRunner, new_requests: Sequence[Any]) -> None:
    """One ``requests.jsonl`` line per request the scheduler sends for the first time (``NewRequestData``; a
    request resumed after a preemption comes among the cached ones, and is not written again)."""
    lines = [
        request_line(new.req_id, state.client_id(new.req_id), sampling(new.sampling_params), new.prompt_token_ids)
        for new in new_requests
    ]
    state.evidence_logs().write_requests(lines)


def numerics(runner: Any, model: Any, failures: list[str]) -> dict[str, Any]:
    """The ``numerics`` values of a runner whose model is loaded (failures named in ``failures``)."""
    model_config = runner.model_config
    cache = runner.cache_config
    parallel = runner.parallel_config
    return read_settings(
        {
            "model_dtype": lambda: dtype_name(model_config.dtype),
            "kv_cache_dtype": lambda: _kv_cache_dtype(cache.cache_dtype, model_config.dtype),
            "head_dtype": lambda: dtype_name(_head_dtype(model, model_config)),
            "attention_backend": lambda: _attention_backends(runner),
            "tensor_parallel": lambda: parallel.tensor_parallel_size,
            "pipeline_parallel": lambda: parallel.pipeline_parallel_size,
            # vLLM's experts are spread over the TP x DP ranks when expert parallelism is on (FusedMoEParallelConfig)
            "expert_parallel": lambda: (
                parallel.tensor_parallel_size * parallel.data_parallel_size if parallel.enable_expert_parallel else 1
            ),
            "prefix_caching": lambda: bool(cache.enable_prefix_caching),
            "chunked_prefill": lambda: bool(runner.scheduler_config.enable_chunked_prefill),
            "eager": lambda: not_eager(runner) is None,
            "quantization": lambda: model_config.quantization,
            "logprobs_mode": lambda: _text(model_config.logprobs_mode),
            "max_model_len": lambda: model_config.max_model_len,
        },
        failures,
    )


def model_configuration(runner: Any, model: Any, failures: list[str]) -> tuple[dict[str, Any], str | None]:
    """The effective model configuration's numerics fields (``hf_text_config``, after ``hf_overrides``), the rope
    theta the rotary modules use, and the fingerprint of the whole ``hf_config``."""
    values = read_settings(
        {
            "hf_config": lambda: runner.model_config.hf_config.to_dict(),
            "hf_text_config": lambda: runner.model_config.hf_text_config.to_dict(),
            "rotary modules": lambda: _rope_bases(model),
        },
        failures,
    )
    whole, bases = values["hf_config"], values["rotary modules"]
    text = values["hf_text_config"] or whole
    fields = config_fields(text) if isinstance(text, Mapping) else {}
    if bases:  # what the model computes with, whatever the config object says
        fields["rope_theta"] = bases[0] if len(bases) == 1 else bases
        fields["rope_theta_source"] = ROPE_FROM_MODULE
    elif fields.get("rope_theta") is not None:
        fields["rope_theta_source"] = ROPE_FROM_CONFIG
    return fields, config_fingerprint(whole) if isinstance(whole, Mapping) else None


def sampling(params: Any) -> dict[str, Any] | None:
    """A request's sampling parameters by :data:`~msprobe_hooks.numerics.SAMPLING_KEYS` (None: a pooling request)."""
    if params is None:
        return None
    return {key: getattr(params, key, None) for key in SAMPLING_KEYS}


def _text(value: Any) -> str | None:
    return None if value is None else str(getattr(value, "value", value))  # a str or an Enum of str


def _kv_cache_dtype(cache_dtype: Any, model_dtype: Any) -> str | None:
    """vLLM's cache dtype name ("fp8_e4m3": the torch storage is uint8, so its name says more); "auto" is the
    model's dtype."""
    return dtype_name(model_dtype) if cache_dtype in (None, "auto") else _text(cache_dtype)


def _head_dtype(model: Any, model_config: Any) -> Any:
    """The dtype the logits are computed in: the logits processor's own ``head_dtype`` (vLLM 0.32's
    ``hf_overrides={"head_dtype": ...}``), else the config's, else the lm_head weight's (releases without one)."""
    processor_dtype = getattr(getattr(model, "logits_processor", None), "head_dtype", None)
    if processor_dtype is not None:
        return processor_dtype
    try:
        return model_config.head_dtype
    except AttributeError:
        return model.lm_head.weight.dtype


def _attention_backends(runner: Any) -> str | None:
    """The attention backends' names (``CPU_ATTN``), comma-joined when the model's layers use several."""
    names = []
    for groups in runner.attn_groups:
        for group in groups:
            name = group.backend.get_name()
            if name not in names:
                names.append(name)
    return ", ".join(names) or None


def _rope_bases(model: Any) -> list[float]:
    """The distinct bases of the model's rotary modules (vLLM's ``RotaryEmbedding*``: ``base`` and ``rotary_dim``),
    in module order."""
    bases: list[float] = []
    for module in model.modules():
        base = getattr(module, "base", None)
        if not isinstance(base, (int, float)) or isinstance(base, bool) or not hasattr(module, "rotary_dim"):
            continue
        if float(base) not in bases:
            bases.append(float(base))
    return bases
