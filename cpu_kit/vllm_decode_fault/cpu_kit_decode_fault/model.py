"""vLLM's Qwen2 with one module's output scaled in decode-only steps (see the package docstring)."""

from __future__ import annotations

import os
from typing import Any

from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM

from cpu_kit_decode_fault import VARIABLE, parse


def decode_only() -> bool:
    """Whether the running forward holds decode tokens only.

    Read from the forward context vLLM sets around each model step: every attention layer's
    metadata (the CPU backend's ``CPUAttentionMetadata`` here) has ``max_query_len``, the most
    tokens any request feeds in this step. 1 means every request feeds one token, which is how
    vLLM's own backends tell decodes from prefills (``split_decodes_and_prefills`` with its
    default threshold of one token). Outside a step (the profile run) there is no metadata.
    """
    if not is_forward_context_available():
        return False
    metadata = get_forward_context().attn_metadata
    if not isinstance(metadata, dict) or not metadata:
        return False
    return all(layer.max_query_len == 1 for layer in metadata.values())


class DecodeFaultQwen2ForCausalLM(Qwen2ForCausalLM):
    """Qwen2 whose module named by the variable is scaled in decode-only steps.

    The module instance's ``forward`` is replaced (not a forward hook): msprobe wraps an instance's
    ``forward`` when it starts and runs its own forward hook first, so only a change inside
    ``forward`` is what msprobe records as that module's output.
    """

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        name, factor = parse(os.environ[VARIABLE])
        module = self.get_submodule(name)
        forward = module.forward

        def faulty_forward(*args: Any, **kwargs: Any) -> Any:
            output = forward(*args, **kwargs)
            if not decode_only():
                return output
            if isinstance(output, tuple):
                return (output[0] * factor, *output[1:])
            return output * factor

        module.forward = faulty_forward
