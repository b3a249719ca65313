"""``msprobe-hooks recipe``: the overrides and exports that satisfy every preflight rule.

Appended to a launch command (Hydra lets the last value of a key win), they turn a training script
into a consistency collection run. The overrides are the rules' own tables of wanted values
(``Rule.wanted``), read for the layout asked for, plus what the hand-written rules need and the few
settings that are not pairing constraints but make the run work (:data:`COLLECTION_RUN`). The test
suite composes verl's config with this output and checks that preflight finds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from msprobe_hooks.contracts import module_version
from msprobe_hooks.preflight.findings import installed
from msprobe_hooks.preflight.model import Layout, hydra_value
from msprobe_hooks.preflight.rules import RULES, dump_config_switch
from msprobe_hooks.preflight.vocabulary import (
    ACTOR,
    GENERATE_CONFIG_PLACEHOLDER,
    MEGATRON,
    REF,
    ROLLOUT,
    ROLLOUT_BACKENDS,
    ROLLOUT_MODULES,
    SGLANG,
    SGLANG_DUMP_KEY,
    SKIP_KEYS,
    TORCHDYNAMO_EXPORT,
    TRAINING_BACKENDS,
    VLLM_ASCEND,
)

# Not checked by a rule of their own, but what the collection run needs.
COLLECTION_RUN: dict[str, object] = {
    # verl requires these once dynamic batch size is off (rule dynamic-batch).
    f"{REF}.log_prob_micro_batch_size_per_gpu": 1,
    f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu": 1,
    f"{ROLLOUT}.data_parallel_size": 1,  # one rollout replica with Megatron too (a rule for FSDP)
    "global_profiler.tool": None,  # rule native-precision-debugger: the role profilers follow it
    f"{ROLLOUT}.agent.num_workers": 1,  # the legacy agent loop splits a batch of DP samples over its workers
    "trainer.total_training_steps": 1,  # one step is all a collection needs
}


@dataclass(frozen=True)
class Recipe:
    """Exports for the job's environment, and Hydra overrides for its command line."""

    environ: dict[str, str]
    overrides: list[str]
    notes: list[str]


def default_rollout_backend() -> str:
    """The rollout engine installed here: vLLM-Ascend, else GPU vLLM, else SGLang; vLLM-Ascend when none is."""
    for backend, module in ROLLOUT_MODULES.items():
        if installed(module):
            return backend
    return VLLM_ASCEND


def skip_switches(verl_version: str | None) -> tuple[str, ...]:
    """The rollout-skip switches of a verl version (the 0.9 layout for an unknown or missing verl)."""
    from packaging.version import InvalidVersion, Version

    try:
        version = Version(verl_version or module_version("verl") or "")
    except InvalidVersion:
        return SKIP_KEYS[:3]
    if version < Version("0.8"):
        return (f"{ROLLOUT}.skip_rollout",)
    if version < Version("0.9"):
        return (f"{ROLLOUT}.skip.enable",)
    return SKIP_KEYS[:3]


def build(
    backend: str,
    gpus: int,
    nnodes: int = 1,
    rollout: str = VLLM_ASCEND,
    generate_config: str | None = None,
    tensor_parallel: int = 1,
    expert_parallel: int = 1,
    verl_version: str | None = None,
) -> Recipe:
    """The recipe for ``gpus`` cards per node on ``nnodes`` nodes; raises ValueError for impossible layouts.

    ``verl_version`` (default: the installed one) picks where the rollout-skip switches live.
    """
    if backend not in TRAINING_BACKENDS:
        raise ValueError(f"--backend {backend!r}: accepted: {', '.join(TRAINING_BACKENDS)}")
    if rollout not in ROLLOUT_BACKENDS:
        raise ValueError(f"--rollout {rollout!r}: accepted: {', '.join(ROLLOUT_BACKENDS)}")
    if gpus < 1 or nnodes < 1 or tensor_parallel < 1 or expert_parallel < 1:
        raise ValueError("--gpus, --nnodes, --tp and --ep must be at least 1")
    world = gpus * nnodes
    if backend == MEGATRON and world % tensor_parallel:
        raise ValueError(f"--tp {tensor_parallel} does not divide the {world} cards")
    # pipeline 1: verl's vLLM rollout has no PP > 1
    megatron = {
        "tensor_model_parallel_size": tensor_parallel,
        "pipeline_model_parallel_size": 1,
        "expert_model_parallel_size": expert_parallel,
    }
    layout = Layout(backend, world, megatron if backend == MEGATRON else {})
    values: dict[str, object] = {"trainer.n_gpus_per_node": gpus, "trainer.nnodes": nnodes}
    values.update({f"{ACTOR}.megatron.{name}": size for name, size in layout.megatron.items()})
    skips = skip_switches(verl_version)
    for rule in RULES:
        if rule.wanted is not None and rule.in_recipe and rule.about(backend):
            wanted = rule.wanted(layout)
            values.update({key: value for key, value in wanted.items() if key not in SKIP_KEYS or key in skips})
    values.update(COLLECTION_RUN)
    exports, switch = dump_config_switch(rollout, generate_config or GENERATE_CONFIG_PLACEHOLDER)
    overrides = [f"{key}={hydra_value(value)}" for key, value in values.items()] + switch
    environ = {**TORCHDYNAMO_EXPORT, **exports}
    notes = [f"rollout backend: {rollout}; training: {backend}, {world} cards, DP {layout.data_parallel}"]
    if generate_config is None:
        notes.append(f"replace {GENERATE_CONFIG_PLACEHOLDER} with your inference msprobe config (--generate-config)")
    if rollout == SGLANG:
        notes.append(f"SGLang >= 0.5.11 can take ++{SGLANG_DUMP_KEY}=PATH instead of MSPROBE_GENERATE_CONFIG")
    return Recipe(environ, overrides, notes)


def lines(recipe: Recipe) -> list[str]:
    """The recipe as shell text: exports, then the overrides one per line with continuations."""
    text = ["# environment of the job"]
    text += [f"export {name}={value}" for name, value in recipe.environ.items()]
    text.append("# append to the launch command (the last value of a key wins)")
    text += [f"    {override} \\" for override in recipe.overrides[:-1]]
    text.append(f"    {recipe.overrides[-1]}")
    return text
