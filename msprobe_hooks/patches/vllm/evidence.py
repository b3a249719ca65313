"""What a vLLM runner effectively runs and each new request asked for: the values of engine.jsonl and requests.jsonl.

The files are :mod:`msprobe_hooks.inference.evidence`'s.

Read once the model is loaded (the runner's first step, and the first after a reload), from the runner's
``model_config`` / ``cache_config`` / ``parallel_config`` / ``scheduler_config``, its attention groups and the
loaded model's modules: the lm_head dtype the logits processor applies, the base each rotary module computes
with (vLLM 0.32 under transformers 5 reads rope from ``rope_parameters``, whatever ``hf_overrides`` set at the
top level).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from msprobe_hooks.inference.dispatch_log import current_rank
from msprobe_hooks.inference.evidence import (
    kv_cache_dtype_name,
    read_sampling,
    setting_text,
    write_engine_line,
)
from msprobe_hooks.join_keys import clock
from msprobe_hooks.numerics import dtype_name
from msprobe_hooks.patches.vllm.batch import not_eager
from msprobe_hooks.patches.vllm.runner_state import VllmRunner


def describe_engine(state: VllmRunner, runner: Any) -> None:
    """One ``engine.jsonl`` line: the settings that change numerics, read from the runner and its loaded model."""
    state.described = (getattr(runner, "model", None), runner.model_config)  # once, even if reading fails
    model = runner.get_model()
    write_engine_line(
        state.evidence_logs(),
        engine=state.engine,
        version=state.engine_version,
        rank=state.rank if state.rank is not None else current_rank(),
        settings=settings(runner, model),
        # the effective configuration: hf_text_config, after hf_overrides
        hf_config=lambda: runner.model_config.hf_config.to_dict(),
        hf_text_config=lambda: runner.model_config.hf_text_config.to_dict(),
        model=model,
    )


def record_requests(state: VllmRunner, new_requests: Sequence[Any]) -> None:
    """One ``requests.jsonl`` line per request the scheduler sends for the first time (``NewRequestData``; a
    request resumed after a preemption comes among the cached ones, and is not written again)."""
    requests = [(new.req_id, read_sampling(new.sampling_params), new.prompt_token_ids) for new in new_requests]
    # the sampling values read now; the engine's prompt lists, which it does not change, encoded off the step
    state.evidence_logs().write_requests_later(requests, clock(), state.client_id)


def settings(runner: Any, model: Any) -> dict[str, Callable[[], Any]]:
    """How to read each ``numerics`` value of a runner whose model is loaded."""
    model_config = runner.model_config
    cache = runner.cache_config
    parallel = runner.parallel_config
    return {
        "model_dtype": lambda: dtype_name(model_config.dtype),
        "kv_cache_dtype": lambda: kv_cache_dtype_name(cache.cache_dtype, model_config.dtype),
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
        "logprobs_mode": lambda: setting_text(model_config.logprobs_mode),
        "max_model_len": lambda: model_config.max_model_len,
    }


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
