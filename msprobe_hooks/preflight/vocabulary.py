"""The words of the preflight: rollout backends, training strategies, and the verl config keys the rules read."""

from __future__ import annotations

from msprobe_hooks.config import VARIABLE

# The rollout backends and the module each is installed as, in the order recipe prefers them.
ROLLOUT_MODULES = {"vllm-ascend": "vllm_ascend", "vllm": "vllm", "sglang": "sglang"}
ROLLOUT_BACKENDS = (VLLM_ASCEND, VLLM, SGLANG) = tuple(ROLLOUT_MODULES)
NO_BACKEND = "unset"  # rollout.name is not set
FSDP_STRATEGIES = ("fsdp", "fsdp2")
MEGATRON = "megatron"
TRAINING_STRATEGIES = (*FSDP_STRATEGIES, MEGATRON)
TRAINING_BACKENDS = ("fsdp", MEGATRON)  # what recipe builds for (fsdp2 is fsdp's engine)

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"
ASCEND_DUMP_KEYS = (
    f"{ROLLOUT}.engine_kwargs.vllm.additional_config.dump_config_path",
    f"{ROLLOUT}.engine_kwargs.vllm.additional_config.dump_config",  # vLLM-Ascend 0.12, and inline from 0.20.2
)
SGLANG_DUMP_KEY = f"{ROLLOUT}.engine_kwargs.sglang.msprobe_dump_config"
# Where verl keeps the rollout-skip switches: top-level ``skip.*`` from 0.9, ``rollout.skip`` in 0.8,
# ``rollout.skip_rollout`` in 0.7.
SKIP_KEYS = (
    "skip.rollout.enable",
    "skip.rollout_tq.enable",
    "skip.async_rollout.enable",
    f"{ROLLOUT}.skip.enable",
    f"{ROLLOUT}.skip_rollout",
)
PROFILER_TOOL_KEYS = ("global_profiler.tool", f"{ACTOR}.profiler.tool", f"{REF}.profiler.tool")
GENERATE_CONFIG_PLACEHOLDER = "/path/to/generate_config.json"
# The export the torchdynamo rule wants (and recipe prints): the value config's record recommends.
TORCHDYNAMO_EXPORT = {"TORCHDYNAMO_DISABLE": VARIABLE["TORCHDYNAMO_DISABLE"].suggested}
# The actor's Megatron sizes that ref and rollout must match: (training name, rollout name).
MEGATRON_PAIRS = (
    ("tensor_model_parallel_size", "tensor_model_parallel_size"),
    ("pipeline_model_parallel_size", "pipeline_model_parallel_size"),
    ("expert_model_parallel_size", "expert_parallel_size"),
)
