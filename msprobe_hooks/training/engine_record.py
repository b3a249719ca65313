"""The training engine's numerics settings, once per process: one line of ``engine.jsonl``.

What a diagnosis needs to tell a precision or configuration cause from a faulty module is what each engine
*really* computes with, which is often not what the user asked for: verl's FSDP engine computes in bf16
(its ``MixedPrecisionPolicy`` default) over fp32 weights, its attention implementation is whatever the
model configuration resolved. So every value here is read from the engine's own objects, never from the
user's overrides:

* the FSDP module's parameters (their stored dtype), its mixed-precision policy (FSDP2 ``fully_shard``'s
  ``MixedPrecisionPolicy``, FSDP1's ``MixedPrecision``), the autocast dtype verl's ``forward_step`` runs
  under (``engine._autocast_dtype``); Megatron's ``TransformerConfig`` and its model chunks;
* the HF configuration object the model was built from (``module.config``; Megatron: the one its bridge
  was built from), its numerics fields (:data:`~msprobe_hooks.numerics.CONFIG_FIELDS`) and its
  fingerprint (:func:`~msprobe_hooks.numerics.config_fingerprint`, the inference side's too);
* the loaded rotary module's ``inv_freq``, from which the base it really uses follows;
* what the first actor forward produced: its output layer's output dtype (one forward hook, removed after
  that forward) and the dtype of the log-probs verl computed from it.

A setting that cannot be read is null, and one line names every such setting; nothing here raises into
verl. :class:`EngineLog` writes the line (``{dump root}/{pid}/engine.jsonl``) for
:class:`~msprobe_hooks.training.actor_dump.ActorDumper`. Nothing here imports torch or verl at import time.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from msprobe_hooks import join_keys, numerics, patching, storage
from msprobe_hooks.jsonl import JsonlLog
from msprobe_hooks.log import logger

if TYPE_CHECKING:
    from msprobe_hooks.config import Config

SIDE = "train"
FSDP, MEGATRON = "verl-fsdp", "verl-megatron"  # the line's "engine"


class Reader:
    """Reads one setting at a time: a setting whose read raises is None, and the failure is kept for one line."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def __call__(self, name: str, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except Exception as exc:  # an engine or configuration of another shape: that setting is not known
            self.failures.append(f"{name} ({type(exc).__name__}: {exc})")
            return None


def dtype_name(dtype: Any) -> str | None:
    """A torch dtype as torch prints it, without ``torch.`` (``bfloat16``); None stays None."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _plain(value: Any) -> Any:
    """A configuration value as JSON holds it (tuples as lists, dtypes and other objects as text)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return dtype_name(value)


_MISSING = object()


def model_config(config: Any, modules: Iterable[tuple[str, Any]], read: Reader) -> dict[str, Any]:
    """The numerics fields the HF configuration ``config`` has (of its text model, for a multi-modal one),
    and ``rotary``: the effective base of the first rotary module among ``modules`` (or None)."""
    text = read("the text configuration", lambda: _text_config(config)) or config
    fields = {}
    for name in numerics.CONFIG_FIELDS:
        value = read(name, functools.partial(getattr, text, name, _MISSING))
        if value is not _MISSING:
            fields[name] = _plain(value)
    fields["rotary"] = read("the rotary module", lambda: rotary(modules))
    return fields


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def rotary(modules: Iterable[tuple[str, Any]]) -> dict[str, Any] | None:
    """The base the first rotary module among ``modules`` (``(name, module)``) really uses, from its ``inv_freq``.

    ``inv_freq[k] = base ** (-k / half)`` (``half = len(inv_freq)``, the rotary dimension over 2), so the last
    entry gives ``base = inv_freq[-1] ** (-half / (half - 1))``, to float32's precision (6 significant digits
    kept). For a scaled RoPE (``rope_type`` other than default: linear, YaRN, ...) it is the base of the scaled
    frequencies' last entry, which is not ``rope_theta``: that difference is the scaling, as loaded.
    """
    for name, module in modules:
        inv_freq = getattr(module, "inv_freq", None)
        if inv_freq is None or getattr(inv_freq, "ndim", 0) != 1 or inv_freq.numel() < 2:
            continue
        half = int(inv_freq.numel())
        base = float(inv_freq[-1]) ** (-half / (half - 1))
        return {
            "base": float(f"{base:.6g}"),
            "source": f"{name}.inv_freq",
            "rope_type": _plain(getattr(module, "rope_type", None)),
            "attention_scaling": _plain(getattr(module, "attention_scaling", None)),
        }
    return None


# --- the engines ---------------------------------------------------------------------------------


def _fsdp_policy(module: Any) -> Any:
    """The FSDP module's mixed-precision policy: FSDP2's ``MixedPrecisionPolicy`` (fully_shard keeps it on the
    module's state), FSDP1's ``MixedPrecision``; None without one."""
    state = getattr(module, "_get_fsdp_state", None)
    if callable(state):
        return state()._mp_policy
    return getattr(module, "mixed_precision", None)


def fsdp_settings(engine: Any, read: Reader) -> tuple[dict[str, Any], Any, Iterable[tuple[str, Any]]]:
    """The FSDP engine's numerics (but the observed dtypes), its HF configuration object, its modules."""
    import torch

    module = read("the module", lambda: engine.module)
    policy = read("the mixed-precision policy", lambda: _fsdp_policy(module))
    param_dtype = read("param_dtype", lambda: dtype_name(next(module.parameters()).dtype))
    # verl's forward_step runs under torch.autocast(_autocast_dtype) unless that is float32 (then no autocast).
    autocast = read("autocast_dtype", lambda: getattr(engine, "_autocast_dtype", torch.bfloat16))
    autocast = None if autocast in (None, torch.float32) else dtype_name(autocast)
    policy_dtype = dtype_name(getattr(policy, "param_dtype", None))
    config = read("the model configuration", lambda: _fsdp_config(engine, module))
    numerics = {
        "model_dtype": autocast or policy_dtype or param_dtype,
        "param_dtype": param_dtype,
        "autocast_dtype": autocast,
        "reduce_dtype": dtype_name(getattr(policy, "reduce_dtype", None)),
        "attention_implementation": read("attention_implementation", lambda: config._attn_implementation),
        "remove_padding": read("remove_padding", lambda: bool(engine.use_remove_padding)),
        "sequence_parallel": read("sequence_parallel", lambda: int(engine.ulysses_sequence_parallel_size)),
        "tensor_parallel": None,  # verl 0.9's FSDP engine has none of these
        "pipeline_parallel": None,
        "expert_parallel": None,
        "context_parallel": None,
    }
    return numerics, config, _named_modules(module)


def _fsdp_config(engine: Any, module: Any) -> Any:
    config = getattr(module, "config", None)  # the model's own (FSDP1 forwards the attribute to the wrapped one)
    return config if config is not None else engine.model_config.hf_config


def fsdp_output_layers(engine: Any) -> list[Any]:
    """The HF model's output layer (``lm_head``)."""
    return [engine.module.get_output_embeddings()]


def _chunks(engine: Any) -> list[Any]:
    return list(engine.module)


def megatron_settings(engine: Any, read: Reader) -> tuple[dict[str, Any], Any, Iterable[tuple[str, Any]]]:
    """The Megatron engine's numerics (but the observed dtypes), its HF configuration object, its modules."""
    tf = read("the TransformerConfig", lambda: engine.tf_config)
    chunks = read("the model chunks", lambda: _chunks(engine)) or []
    param_dtype = read("param_dtype", lambda: dtype_name(next(chunks[0].parameters()).dtype))

    def compute_dtype() -> str | None:
        return "bfloat16" if tf.bf16 else "float16" if tf.fp16 else dtype_name(tf.params_dtype)

    def reduce_dtype() -> str | None:
        ddp = getattr(chunks[0], "ddp_config", None)
        if ddp is None:
            return None
        return "float32" if ddp.grad_reduce_in_fp32 else compute_dtype()

    backend = read("attention_implementation", lambda: tf.attention_backend)
    numerics = {
        "model_dtype": read("model_dtype", compute_dtype),
        "param_dtype": param_dtype,
        "autocast_dtype": None,  # Megatron casts its modules, it runs no autocast
        "reduce_dtype": read("reduce_dtype", reduce_dtype),
        "attention_implementation": getattr(backend, "name", None if backend is None else str(backend)),
        "remove_padding": read("remove_padding", lambda: bool(engine.engine_config.use_remove_padding)),
        "sequence_parallel": read("sequence_parallel", lambda: bool(tf.sequence_parallel)),
        "tensor_parallel": read("tensor_parallel", lambda: int(tf.tensor_model_parallel_size)),
        "pipeline_parallel": read("pipeline_parallel", lambda: int(tf.pipeline_model_parallel_size)),
        "expert_parallel": read("expert_parallel", lambda: int(tf.expert_model_parallel_size)),
        "context_parallel": read("context_parallel", lambda: int(tf.context_parallel_size)),
    }
    config = read("the model configuration", lambda: engine.model_config.hf_config)
    return numerics, config, (item for chunk in chunks for item in _named_modules(chunk))


def megatron_output_layers(engine: Any) -> list[Any]:
    """Each model chunk's ``output_layer`` (the last pipeline stage holds one)."""
    return [
        m for chunk in _chunks(engine) for name, m in chunk.named_modules() if name.rsplit(".", 1)[-1] == "output_layer"
    ]


def _named_modules(module: Any) -> Iterable[tuple[str, Any]]:
    return module.named_modules() if hasattr(module, "named_modules") else ()


Settings = Callable[[Any, Reader], tuple[dict[str, Any], Any, Iterable[tuple[str, Any]]]]
ENGINES: dict[str, tuple[Settings, Callable[[Any], list[Any]]]] = {
    FSDP: (fsdp_settings, fsdp_output_layers),
    MEGATRON: (megatron_settings, megatron_output_layers),
}


# --- the first forward, and the line ---------------------------------------------------------------


class LogitsWatch:
    """The dtype of the output layer's output in one forward: a forward hook on each output layer, removed
    by :meth:`remove` (a forward that never reaches one, e.g. verl's fused kernels, leaves it None)."""

    def __init__(self) -> None:
        self.dtype: str | None = None
        self.failure: str | None = None
        self._handles: list[Any] = []

    def attach(self, heads: list[Any]) -> None:
        self._handles = [head.register_forward_hook(self._seen) for head in heads]

    def _seen(self, module: Any, args: Any, output: Any) -> None:
        if self.dtype is None:  # Megatron's output layer returns (logits, bias)
            value = output[0] if isinstance(output, tuple) and output else output
            self.dtype = dtype_name(getattr(value, "dtype", None))

    def remove(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()


def _log_probs_dtype(result: Any) -> str | None:
    from msprobe_hooks.training.logprob_gap import output_log_probs

    return dtype_name(getattr(output_log_probs(result), "dtype", None))


def engine_line(engine_name: str, engine: Any, watch: LogitsWatch, result: Any, read: Reader) -> dict[str, Any]:
    """The ``engine.jsonl`` line of ``engine`` (``FSDP`` or ``MEGATRON``), whose first actor forward, watched by
    ``watch``, returned ``result``. Settings ``read`` cannot read are None (``read.failures`` names them)."""
    import torch

    settings, _ = ENGINES[engine_name]
    engine_numerics, config, modules = settings(engine, read)
    engine_numerics["logits_dtype"] = watch.dtype
    engine_numerics["log_probs_dtype"] = read("log_probs_dtype", lambda: _log_probs_dtype(result))
    if watch.failure is not None:
        read.failures.append(watch.failure)
    fields = model_config(config, modules, read) if config is not None else None
    as_dict = read("the model configuration's fields", lambda: config.to_dict()) if config is not None else None
    version = read("verl's version", _verl_version)
    return {
        "side": SIDE,
        "engine": engine_name,
        "version": version,
        "pid": os.getpid(),
        "rank": torch.distributed.get_rank() if torch.distributed.is_initialized() else None,
        "time": join_keys.clock(),
        "numerics": engine_numerics,
        "model_config": fields,
        "model_config_fingerprint": None if as_dict is None else numerics.config_fingerprint(as_dict),
    }


def _verl_version() -> str:
    from importlib.metadata import version

    return version("verl")


class EngineLog:
    """This process's ``engine.jsonl``: one line, written after the first watched actor forward.

    ``root(cfg)`` gives the training dump root (as for the gap log: written whether or not anything is dumped).
    """

    def __init__(self, root: Callable[[Config], str]) -> None:
        self._root = root
        self._watch: LogitsWatch | None = None
        self.done = False

    def watch(self, engine_name: str, engine: Any) -> None:
        """Before the process's first actor forward: watch its output layer (nothing once the line is written)."""
        if self.done or self._watch is not None:
            return
        watch = LogitsWatch()
        try:
            watch.attach(ENGINES[engine_name][1](engine))
        except Exception as exc:  # an engine of another shape: the line says the logits' dtype is not known
            watch.failure = f"logits_dtype ({type(exc).__name__}: {exc})"
        self._watch = watch

    def write(self, cfg: Config, engine_name: str, engine: Any, result: Any) -> None:
        """After that forward returned ``result``: the line, once."""
        watch, self._watch = self._watch, None
        if watch is None:
            return
        watch.remove()
        self.done = True
        read = Reader()
        line = engine_line(engine_name, engine, watch, result, read)
        if read.failures:
            logger().warning(
                "%s of the %s engine: could not read %s; written as null",
                join_keys.ENGINE_LOG,
                engine_name,
                "; ".join(read.failures),
            )
        log = JsonlLog(self._root(cfg), join_keys.ENGINE_LOG)
        try:
            log.write(line)
        except OSError as exc:  # a full or removed dump root: one line naming the cause
            storage.report_loss(f"the {join_keys.ENGINE_LOG} line", exc, log.path, patching.strict())
