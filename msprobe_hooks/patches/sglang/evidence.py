"""What an SGLang runner effectively runs and each new request asked for: the values of engine.jsonl and requests.jsonl.

The files and their shape are :mod:`msprobe_hooks.inference.evidence`'s, as vLLM's runners write them
(:mod:`msprobe_hooks.patches.vllm.evidence`).

The engine line is read once per runner, at the end of ``ModelRunner.__init__`` (the model is loaded by then), from
the runner (``model_config``, ``dtype``, parallel sizes), its ``server_args`` as resolved, the loaded model (its
logits processor's ``use_fp32_lm_head``, its rotary modules' bases) and the sampler's switch for what log-probs are
returned. A request's line is made when a batch first holds it (:func:`request_line_of`, from
:mod:`.forward_batch`), from its ``Req``: ``sampling_params``, ``return_logprob`` / ``top_logprobs_num``,
``origin_input_ids``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from msprobe_hooks.inference.dispatch_log import current_rank
from msprobe_hooks.inference.evidence import kv_cache_dtype_name, request_line, sampling_values, write_engine_line
from msprobe_hooks.numerics import RAW_LOGPROBS, TEMPERATURE_SCALED_LOGPROBS, dtype_name

# Where SGLang's sampler reads, once at import, whether it returns the log-probs of the raw logits
# (SGLANG_RETURN_ORIGINAL_LOGPROB=1) instead of its default, log_softmax(logits / temperature).
_SAMPLER = "sglang.srt.layers.sampler"
_RETURNS_RAW = "SGLANG_RETURN_ORIGINAL_LOGPROB"


def describe_engine(state: Any, runner: Any) -> None:
    """One ``engine.jsonl`` line: the settings that change numerics, read from the runner and its loaded model
    (``state``: the runner's :class:`~.model_runner.SglangRunner`)."""
    model = runner.model
    write_engine_line(
        state.evidence,
        engine=state.engine,
        version=state.engine_version,
        rank=current_rank(),
        settings=settings(runner, model),
        hf_config=lambda: runner.model_config.hf_config.to_dict(),
        hf_text_config=lambda: runner.model_config.hf_text_config.to_dict(),
        model=model,
    )


def settings(runner: Any, model: Any) -> dict[str, Callable[[], Any]]:
    """How to read each ``numerics`` value of a runner whose model is loaded."""
    arg = resolved_arg_reader(runner.server_args)
    return {
        "model_dtype": lambda: dtype_name(runner.model_config.dtype),
        # "auto" resolves to the model's dtype, as vLLM's does
        "kv_cache_dtype": lambda: kv_cache_dtype_name(arg("kv_cache_dtype"), runner.model_config.dtype),
        "head_dtype": lambda: head_dtype(model, runner.model_config),
        "attention_backend": lambda: arg("attention_backend"),
        "tensor_parallel": lambda: runner.tp_size,
        "pipeline_parallel": lambda: runner.pp_size,
        "expert_parallel": lambda: runner.moe_ep_size,
        "prefix_caching": lambda: not arg("disable_radix_cache"),
        "chunked_prefill": lambda: (arg("chunked_prefill_size") or 0) > 0,  # -1 or None: off
        "eager": lambda: eager(arg),
        "quantization": lambda: runner.model_config.quantization,
        "logprobs_mode": logprobs_mode,
        "max_model_len": lambda: runner.model_config.context_len,
    }


def resolved_arg_reader(server_args: Any) -> Callable[[str], Any]:
    """How to read a ServerArgs field as the engine resolved it: SGLang releases whose ServerArgs keeps raw input and
    resolution apart (0.5.21's ``arg_groups``) answer through their own ``resolution_result``; older ones resolve in
    place, so the attribute is the value (a field the release lacks: ``AttributeError``)."""
    try:
        from sglang.srt.arg_groups.overrides import resolution_result
    except ImportError:
        return lambda field: getattr(server_args, field)

    def read(field: str) -> Any:
        getattr(server_args, field)  # a field this release lacks reads as absent, not as its fallback
        return resolution_result(server_args, field)

    return read


def head_dtype(model: Any, model_config: Any) -> str | None:
    """The dtype the logits are computed in: float32 when the logits processor says it uses an fp32 lm_head
    (``--enable-fp32-lm-head``, or a model config's ``enable_lm_head_fp32``), else the model's."""
    return "float32" if model.logits_processor.use_fp32_lm_head else dtype_name(model_config.dtype)


def eager(arg: Callable[[str], Any]) -> bool:
    """Whether every forward runs eagerly: no CUDA graph in any phase and no torch.compile. Releases with a
    resolved per-phase ``cuda_graph_config`` say it there (every phase's backend "disabled"); older ones by
    ``disable_cuda_graph`` and their piecewise switch, as each spells it."""
    try:
        graphs = arg("cuda_graph_config")
    except AttributeError:
        graphs = None
    if graphs is not None:
        graph_off = all(getattr(graphs, phase).backend == "disabled" for phase in ("decode", "prefill"))
    else:
        piecewise = _optional(arg, "enable_piecewise_cuda_graph", False) or not _optional(
            arg, "disable_piecewise_cuda_graph", True
        )
        graph_off = bool(arg("disable_cuda_graph")) and not piecewise
    return graph_off and not arg("enable_torch_compile")


def _optional(arg: Callable[[str], Any], field: str, absent: Any) -> Any:
    try:
        return arg(field)
    except AttributeError:
        return absent


def logprobs_mode() -> str | None:
    """What SGLang's returned log-probs are of, as its sampler decides: the raw logits' with
    ``SGLANG_RETURN_ORIGINAL_LOGPROB``, else (its default) the temperature-scaled logits', before top-k / top-p /
    min-p (the sampler filters a copy of the probabilities). The model runner imports the sampler, so it is loaded by
    the time a runner is described; None where it is not (a release without it)."""
    sampler = sys.modules.get(_SAMPLER)
    if sampler is None:
        return None
    return RAW_LOGPROBS if getattr(sampler, _RETURNS_RAW) else TEMPERATURE_SCALED_LOGPROBS


def request_line_of(req: Any) -> str:
    """A ``requests.jsonl`` line of an SGLang ``Req`` (SGLang keeps the client's id as is: the base id is the id)."""
    rid = str(req.rid)
    params = getattr(req, "sampling_params", None)  # never a failure here: the request's identity is made with it
    asked = getattr(req, "return_logprob", False)
    return request_line(
        rid,
        rid,
        sampling_values(
            params,
            logprobs=getattr(req, "top_logprobs_num", None) if asked else None,
            seed=getattr(params, "sampling_seed", None),
        ),
        req.origin_input_ids,
    )
