"""verl's real Megatron training engine on CPU: ``MegatronEngineWithLMHead``, megatron-core 0.16.1, mbridge 0.15.1.

The same tiny Qwen2 folder as :mod:`cpu_kit.verl_cpu` (``build_model_dir``) loads here through
mbridge's Qwen2 bridge, so one HF checkpoint feeds the Megatron engine and the real vLLM engine.
Nothing in verl, megatron-core or mbridge is edited; what a CPU needs is done in this process:

* verl's CPU platform (:func:`cpu_kit.verl_cpu.register_cpu_platform`), gloo;
* megatron-core asks ``torch.cuda.current_device()`` where to put buffers, and mbridge moves the
  model with ``Module.cuda()``: answered "cpu" and made a no-op; the pipeline schedule's
  ``torch.cuda.synchronize()`` does nothing;
* ``device="cuda"`` literals and ``Tensor.cuda()`` in Megatron's schedule and optimizer, and the
  optimizer's ``param.type() == "torch.cuda.*Tensor"`` checks: a process-wide
  ``TorchFunctionMode`` (:class:`_CudaOnCpu`) maps them to the CPU;
* the CUDA RNG tracker's ``fork()`` (dropout): megatron's own inference tracker, which forks nothing;
* mbridge builds the TransformerEngine layer spec: the Qwen2 bridge is registered again
  (:class:`_LocalSpecQwen2Bridge`) with megatron's plain-torch "local" spec, whose separate
  ``input_layernorm`` / ``pre_mlp_layernorm`` need two more HF weight names;
* the local attention has no packed (THD) path: BSHD (``use_remove_padding=False``), with verl's
  ``[b, s]`` padding mask turned into the ``[b, 1, s, s]`` causal + padding mask that
  ``DotProductAttention`` reads (:func:`_attention_mask`);
* every fusion off, no sequence parallelism (mbridge turns it on whenever TP > 1, and the torch
  RMSNorm refuses it), bf16 (verl's Megatron config refuses fp32), ``vanilla_mbridge=True``
  (verl's default, Megatron-Bridge, needs TransformerEngine).

Call :func:`init_process` first in every process (world size 1 without torchrun), then
:func:`make_engine`; :func:`log_probs` and :func:`update` are :mod:`cpu_kit.verl_cpu`'s.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from cpu_kit import verl_cpu
from cpu_kit.verl_cpu import log_probs, update

__all__ = ["init_process", "make_engine", "log_probs", "update"]

# megatron-core's fusions all need CUDA kernels (apex, TransformerEngine or its own).
NO_FUSIONS = {
    "gradient_accumulation_fusion": False,
    "bias_activation_fusion": False,
    "masked_softmax_fusion": False,
    "bias_dropout_fusion": False,
    "apply_rope_fusion": False,
    "persist_layer_norm": False,
}


def _is_cuda(device: Any) -> bool:
    """A device argument naming a CUDA device: ``"cuda"``, ``"cuda:1"``, ``torch.device("cuda")`` or an index."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


class _CudaOnCpu(TorchFunctionMode):
    """Every tensor made or moved "to CUDA" stays on the CPU, and says it is a CUDA tensor when asked its type."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if not name.startswith("torch.cuda.") else name
        if _is_cuda(kwargs.get("device")):
            kwargs = {**kwargs, "device": "cpu"}
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


_installed = False


def _install_redirections() -> None:
    """The CPU answers to megatron-core's and mbridge's CUDA calls, once per process."""
    global _installed
    if _installed:
        return
    _installed = True
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda device=None: None  # pipeline parallelism's p2p exchanges
    torch.nn.Module.cuda = lambda self, device=None: self
    _CudaOnCpu().__enter__()  # for the life of the process: verl's code calls "cuda" anywhere
    from megatron.core.tensor_parallel import random as tp_random

    # The tracker megatron uses in inference: seeding and forking it touch no CUDA RNG state.
    tp_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    _register_local_spec_bridge()
    _convert_attention_masks()


def _register_local_spec_bridge() -> None:
    from mbridge.core.bridge import register_model
    from mbridge.models.qwen2 import Qwen2Bridge
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    @register_model("qwen2")
    class _LocalSpecQwen2Bridge(Qwen2Bridge):
        """Qwen2 on megatron's plain-torch layer spec: its norms are modules of their own, not fused into linears."""

        # Both names go through the bridge's own lookups: a layer-local name with "mlp" in it is an
        # MLP weight, any other layer-local name not of the attention is looked up among the rest.
        _MLP_MAPPING = {
            **Qwen2Bridge._MLP_MAPPING,
            "pre_mlp_layernorm.weight": ["model.layers.{layer_number}.post_attention_layernorm.weight"],
        }
        _OTHER_MAPPING = {
            **Qwen2Bridge._OTHER_MAPPING,
            "input_layernorm.weight": ["model.layers.{layer_number}.input_layernorm.weight"],
        }

        def _get_transformer_layer_spec(self, vp_stage: int | None = None) -> Any:
            self.has_vp_stage = True  # what mbridge's own method records: megatron-core 0.16 takes vp_stage
            return get_gpt_decoder_block_spec(self.config, use_transformer_engine=False, vp_stage=vp_stage)


def _attention_mask(padding: torch.Tensor) -> torch.Tensor:
    """verl's BSHD ``[b, s]`` mask (True: a real token) as ``[b, 1, s, s]`` (True: masked out): causal and padding."""
    length = padding.shape[-1]
    future = torch.ones(length, length, dtype=torch.bool, device=padding.device).triu(1)
    return future[None, None] | ~padding.bool()[:, None, None, :]


def _convert_attention_masks() -> None:
    from megatron.core.models.gpt.gpt_model import GPTModel

    forward = GPTModel.forward

    def forward_with_4d_mask(self: Any, *args: Any, **kwargs: Any) -> Any:
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 2:
            kwargs["attention_mask"] = _attention_mask(mask)
        return forward(self, *args, **kwargs)

    GPTModel.forward = forward_with_4d_mask


def init_process() -> tuple[int, int]:
    """:func:`cpu_kit.verl_cpu.init_process`, then the CPU redirections; returns (rank, world size)."""
    rank, world_size = verl_cpu.init_process()
    _install_redirections()
    return rank, world_size


def make_engine(
    model_dir: str,
    *,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    virtual_pipeline: int | None = None,
    forward_only: bool = False,
    value_head: bool = False,
    micro_batch_size: int = 2,
    lr: float = 1e-3,
) -> Any:
    """An initialised ``MegatronEngineWithLMHead`` (actor, or ref with ``forward_only``) or
    ``MegatronEngineWithValueHead`` (critic) over ``model_dir``."""
    init_process()
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import HFModelConfig, McoreEngineConfig, McoreOptimizerConfig
    from verl.workers.engine.megatron.transformer_impl import MegatronEngineWithLMHead, MegatronEngineWithValueHead

    model_config = HFModelConfig(
        path=model_dir,
        use_remove_padding=False,
        enable_gradient_checkpointing=False,
        model_type="value_model" if value_head else "language_model",
    )
    transformer = {
        **NO_FUSIONS,
        "attention_backend": "local",
        "sequence_parallel": False,
        "use_cpu_initialization": True,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
    }
    engine_config = McoreEngineConfig(
        forward_only=forward_only,
        tensor_model_parallel_size=tensor_parallel,
        pipeline_model_parallel_size=pipeline_parallel,
        virtual_pipeline_model_parallel_size=virtual_pipeline,
        sequence_parallel=False,
        use_distributed_optimizer=False,
        use_remove_padding=False,
        use_fused_kernels=False,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=micro_batch_size,
        vanilla_mbridge=True,
        dtype="bfloat16",
        override_transformer_config=transformer,
    )
    optimizer_config = McoreOptimizerConfig(lr=lr, total_training_steps=10)
    cls = MegatronEngineWithValueHead if value_head else MegatronEngineWithLMHead
    engine = cls(
        model_config=model_config,
        engine_config=engine_config,
        optimizer_config=optimizer_config,
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()
    return engine
