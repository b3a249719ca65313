"""A decode-only fault for the real vLLM engine, planted through vLLM's ``vllm.general_plugins`` entry point.

    CPU_KIT_DECODE_FAULT=model.layers.1.mlp.down_proj:1.05

multiplies that module's output (its first element when it returns a tuple, as vLLM's parallel
linears do) by the factor in every model step that holds decode tokens only; prefill steps, and
steps that pack a prefill beside decodes, run untouched. Unset or empty, :func:`register` returns
at once and vLLM runs its own model classes: the plugin is inert.

vLLM calls :func:`register` in every one of its processes. With the variable set it registers
:class:`~cpu_kit_decode_fault.model.DecodeFaultQwen2ForCausalLM` for the ``Qwen2ForCausalLM``
architecture (lazily, by name, as vLLM asks of plugins), so the worker builds the model with the
fault in place. Only Qwen2 (the kit's model) is covered. A bad value stops the engine's start with
one line naming the variable.
"""

from __future__ import annotations

import os

VARIABLE = "CPU_KIT_DECODE_FAULT"
ARCHITECTURE = "Qwen2ForCausalLM"


def parse(value: str) -> tuple[str, float]:
    """``MODULE:FACTOR`` as (vLLM module path, factor); ValueError naming the variable otherwise."""
    name, sep, factor = value.strip().rpartition(":")
    try:
        scale = float(factor)
    except ValueError:
        scale = None
    if not sep or not name or scale is None:
        raise ValueError(f"{VARIABLE}={value!r}: expected MODULE:FACTOR, e.g. model.layers.1.mlp.down_proj:1.05")
    return name, scale


def register() -> None:
    """vLLM's plugin hook: swap in the faulty Qwen2 when the variable is set, else nothing."""
    value = os.environ.get(VARIABLE, "")
    if not value.strip():
        return
    parse(value)  # fail here, in every process, rather than deep inside the worker's model build
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, f"{__name__}.model:DecodeFaultQwen2ForCausalLM")
