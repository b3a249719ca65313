"""The preflight rules, in the order they are checked and documented (``docs/preflight.md`` is generated from them).

Most rules are a table of wanted values (:class:`.model.Rule` ``wanted``), which the check compares with the
config and ``recipe`` prints as overrides; the others check by hand.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from msprobe_hooks.config import LOG_PROB, SHIM_PACKAGE, read_msprobe_config
from msprobe_hooks.preflight.model import ABSENT, CheckedRun, Layout, Rule, Violation, expect, fixed, hydra_value
from msprobe_hooks.preflight.vocabulary import (
    ACTOR,
    ASCEND_DUMP_KEYS,
    FSDP_STRATEGIES,
    GENERATE_CONFIG_PLACEHOLDER,
    MEGATRON,
    MEGATRON_PAIRS,
    NO_BACKEND,
    PROFILER_TOOL_KEYS,
    REF,
    ROLLOUT,
    SGLANG,
    SGLANG_DUMP_KEY,
    SKIP_KEYS,
    TORCHDYNAMO_EXPORT,
    TRAINING_STRATEGIES,
    VLLM,
    VLLM_ASCEND,
)
from msprobe_hooks.training import prompts_only, virtual_pipeline

if TYPE_CHECKING:
    from omegaconf import DictConfig


_batch_size = fixed(
    {
        "data.train_batch_size": 1,
        f"{ACTOR}.ppo_mini_batch_size": 1,
        f"{ACTOR}.ppo_micro_batch_size_per_gpu": 1,
        f"{ACTOR}.ppo_micro_batch_size": None,  # deprecated global size; verl rejects both set
    }
)


def _rollout_n(layout: Layout) -> dict[str, object]:
    return {f"{ROLLOUT}.n": layout.data_parallel}


def _sequence_parallel(layout: Layout) -> dict[str, object]:
    size = "megatron.context_parallel_size" if layout.strategy == MEGATRON else "ulysses_sequence_parallel_size"
    return {f"{role}.{size}": 1 for role in (ACTOR, REF)}


def _torchdynamo(run: CheckedRun) -> list[Violation]:
    violations = []
    for name, value in TORCHDYNAMO_EXPORT.items():
        in_ray_env = run.get(f"ray_kwargs.ray_init.runtime_env.env_vars.{name}")
        if run.environ.get(name) != value and str(in_ray_env) != value:
            violations.append(
                Violation(f"{name} is {run.environ.get(name, 'unset')}, needs {value}", f"export {name}={value}")
            )
    return violations


RAY_ENV_VARS = "ray_kwargs.ray_init.runtime_env.env_vars"


def _ray_cluster_apart(run: CheckedRun) -> list[Violation]:
    """A job that joins a Ray cluster started apart (``ray start``): its workers inherit the cluster's environment,
    not the driver's, so the hooks reach them only through the job's runtime_env."""
    address = run.get("ray_kwargs.ray_init.address")
    if address is ABSENT or address is None:
        address = run.environ.get("RAY_ADDRESS")
    if address in (None, "", "local"):
        return []  # ray.init starts the cluster itself: its workers inherit the driver's environment
    missing = []
    if str(run.get(f"{RAY_ENV_VARS}.DUMP_ON")) != "1":
        missing.append("DUMP_ON=1")
    pythonpath = str(run.get(f"{RAY_ENV_VARS}.PYTHONPATH"))
    if not any(os.path.basename(os.path.normpath(p)) == SHIM_PACKAGE for p in pythonpath.split(os.pathsep) if p):
        missing.append(f"PYTHONPATH with the shim's folder ({SHIM_PACKAGE})")
    if not missing:
        return []
    problem = (
        f"the job joins the Ray cluster at {address}, started apart: its workers do not inherit this shell's "
        f"environment, and {RAY_ENV_VARS} lacks {' and '.join(missing)}, so no worker dumps"
    )
    return [Violation(problem, 'eval "RAY_ENV=($(msprobe-hooks ray-env))", then add "${RAY_ENV[@]}" to the command')]


def _fsdp_parallel(layout: Layout) -> dict[str, object]:
    return {f"{ROLLOUT}.tensor_model_parallel_size": layout.world_size, f"{ROLLOUT}.data_parallel_size": 1}


def _megatron_parallel(layout: Layout) -> dict[str, object]:
    wanted: dict[str, object] = {}
    for train_name, rollout_name in MEGATRON_PAIRS:
        wanted[f"{REF}.megatron.{train_name}"] = layout.megatron[train_name]
        wanted[f"{ROLLOUT}.{rollout_name}"] = layout.megatron[train_name]
    return wanted


def _strategy(run: CheckedRun) -> list[Violation]:
    if run.strategy in TRAINING_STRATEGIES:
        return []
    return [Violation(f"{ACTOR}.strategy is {run.strategy}", "model_engine=dp (FSDP) or model_engine=megatron")]


_ROLLOUT_CORRECTION = "algorithm.rollout_correction"
_rollout_correction = fixed(  # a null block is off as well
    {
        **{f"{_ROLLOUT_CORRECTION}.{key}": None for key in ("rollout_is", "rollout_rs", "rollout_rs_threshold")},
        f"{_ROLLOUT_CORRECTION}.rollout_is_batch_normalize": False,
    }
)
# Keys an older verl lacks (router replay before 0.7.1, dynamic CP before 0.8) are off there.
_megatron_prompt_forward_blockers = fixed(
    {f"{ACTOR}.megatron.router_replay.mode": "disabled", f"{ACTOR}.megatron.dynamic_context_parallel": False}
)


_VIRTUAL_PIPELINE = f"{ACTOR}.megatron.{virtual_pipeline.CONFIG_KEY}"


def _virtual_pipeline(run: CheckedRun) -> list[Violation]:
    """Null (or absent) and 1 are off; the Megatron engine patch would refuse anything else."""
    size = run.get(_VIRTUAL_PIPELINE)
    if size is ABSENT or size is None or (size == 1 and not isinstance(size, bool)):
        return []
    violation = expect(run, _VIRTUAL_PIPELINE, None)
    return [violation] if violation else []


def _prompts_only_mode(run: CheckedRun) -> str:
    """The mode the job will run in: PROMPTS_ONLY=1 trims by itself with Megatron pipeline parallelism."""
    pipeline = run.layout.megatron.get("pipeline_model_parallel_size", 1)
    return prompts_only.mode(run.settings, pipeline)


def _native_debugger(run: CheckedRun) -> list[Violation]:
    # Role tools interpolate the global one by default: name only the keys that were set.
    return [
        Violation(f"{key} is precision_debugger", f"{key}=null")
        for key in PROFILER_TOOL_KEYS
        if run.get(key) == "precision_debugger" and not _is_interpolation(run.config, *key.rsplit(".", 1))
    ]


def _is_interpolation(config: DictConfig, parent: str, leaf: str) -> bool:
    from omegaconf import DictConfig, OmegaConf

    node = OmegaConf.select(config, parent, default=None, throw_on_missing=False)
    return isinstance(node, DictConfig) and leaf in node and OmegaConf.is_interpolation(node, leaf)


def _dump_config_file(key: str, path: object) -> list[Violation]:
    """A dump config named in the verl config must exist here and be one msprobe accepts."""
    if not isinstance(path, str):
        return []  # inline dict (vLLM-Ascend >= 0.20.2): msprobe checks it
    try:
        read_msprobe_config(key, path)
    except ValueError as exc:
        return [Violation(str(exc), f"++{key}=<an existing msprobe config.json>")]
    return []


def dump_config_switch(backend: str, path: str) -> tuple[dict[str, str], list[str]]:
    """How rollout ``backend`` is given the inference dump config ``path``: (exports, Hydra overrides).

    vLLM-Ascend reads its verl key; GPU vLLM and SGLang read MSPROBE_GENERATE_CONFIG (SGLang >= 0.5.11
    also takes SGLANG_DUMP_KEY; the variable works with every version). Rule inference-dump-config
    suggests it, recipe prints it.
    """
    if backend == VLLM_ASCEND:
        return {}, [f"++{ASCEND_DUMP_KEYS[0]}={hydra_value(path)}"]
    return {"MSPROBE_GENERATE_CONFIG": path}, []


def _switch_fix(backend: str, path: str) -> str:
    exports, overrides = dump_config_switch(backend, path)
    return " ".join([*(f"export {name}={value}" for name, value in exports.items()), *overrides])


def _inference_dump_config(run: CheckedRun) -> list[Violation]:
    backend = run.rollout_backend
    generate = run.settings.generate_config
    suggested = generate or GENERATE_CONFIG_PLACEHOLDER
    if backend == VLLM_ASCEND:
        for key in ASCEND_DUMP_KEYS:
            value = run.get(key)
            if value is not ABSENT and value is not None:
                return _dump_config_file(key, value)
        note = " (MSPROBE_GENERATE_CONFIG is not read by vLLM-Ascend)" if generate else ""
        return [
            Violation(
                f"vLLM-Ascend rollout without additional_config.dump_config_path{note}",
                _switch_fix(backend, suggested),
            )
        ]
    if backend == SGLANG:
        if generate:
            return []
        value = run.get(SGLANG_DUMP_KEY)
        if value is not ABSENT and value is not None:
            return _dump_config_file(SGLANG_DUMP_KEY, value)
        return [
            Violation(
                "SGLang rollout without msprobe_dump_config or MSPROBE_GENERATE_CONFIG",
                _switch_fix(backend, suggested),
            )
        ]
    if backend == VLLM:
        if generate:
            return []
        ascend_only = run.get(ASCEND_DUMP_KEYS[0]) not in (ABSENT, None)
        note = "; additional_config.dump_config_path is read by vLLM-Ascend only" if ascend_only else ""
        return [
            Violation(
                f"GPU vLLM rollout without MSPROBE_GENERATE_CONFIG (vLLM has no msprobe switch of its own{note})",
                _switch_fix(backend, suggested),
            )
        ]
    if backend == NO_BACKEND:
        return [Violation(f"{ROLLOUT}.name is not set", f"{ROLLOUT}.name=vllm (or sglang)")]
    return [Violation(f"rollout {backend} has no msprobe inference dump", f"{ROLLOUT}.name=vllm (or sglang)")]


RULES: tuple[Rule, ...] = (
    Rule(
        "batch-size",
        "data.train_batch_size, actor ppo_mini_batch_size and ppo_micro_batch_size_per_gpu are 1",
        "each training rank must hold one sample in one micro-batch (one mini-batch, no gradient accumulation), "
        "so that one training dump is one request",
        wanted=_batch_size,
    ),
    Rule(
        "rollout-n",
        "actor_rollout_ref.rollout.n equals the training data-parallel size (FSDP: cards / SP; "
        "Megatron: cards / (TP*PP*CP))",
        "one prompt with n = DP responses gives every data-parallel rank exactly one sample; otherwise ranks get "
        "none or several and training dumps no longer map one-to-one to inference requests",
        wanted=_rollout_n,
    ),
    Rule(
        "sequence-parallel",
        "Ulysses sequence parallelism (FSDP) or context parallelism (Megatron) is 1 for actor and ref",
        "sequence parallelism splits a sample's tokens across ranks, so no training dump covers the whole prompt "
        "that the inference prefill saw",
        wanted=_sequence_parallel,
    ),
    Rule(
        "remove-padding",
        "actor_rollout_ref.model.use_remove_padding is True",
        "padded training inputs have other shapes than the packed inference prefill, so the tensors do not compare",
        wanted=fixed({"actor_rollout_ref.model.use_remove_padding": True}),
    ),
    Rule(
        "dynamic-batch",
        "dynamic batch size is off for actor, ref and rollout log-prob",
        "dynamic batching regroups samples into micro-batches by token count, so which micro-batch holds a "
        "request is not fixed",
        wanted=fixed(
            {
                f"{ACTOR}.use_dynamic_bsz": False,
                f"{REF}.log_prob_use_dynamic_bsz": False,
                f"{ROLLOUT}.log_prob_use_dynamic_bsz": False,
            }
        ),
    ),
    Rule(
        "balance-batch",
        "trainer.balance_batch is False",
        "balancing reorders samples across ranks by length, so the rank holding a request no longer follows the "
        "order the rollout produced",
        wanted=fixed({"trainer.balance_batch": False}),
    ),
    Rule(
        "val-before-train",
        "trainer.val_before_train is False",
        "validation generate calls run first and land in the inference dump, shifting its step numbers",
        wanted=fixed({"trainer.val_before_train": False}),
    ),
    Rule(
        "rollout-skip",
        "rollout skip is off (skip.rollout / rollout_tq / async_rollout, or rollout.skip before verl 0.9)",
        "a skipped rollout replays cached responses, so the inference side writes no dump for them",
        wanted=fixed(dict.fromkeys(SKIP_KEYS, False)),
        where_present=True,  # each verl has its own; recipe prints the installed verl's (recipe.skip_switches)
    ),
    Rule(
        "eager-rollout",
        "actor_rollout_ref.rollout.enforce_eager is True",
        "msprobe hooks need eager execution: vLLM-Ascend refuses to dump in graph mode (or, from 0.20.2, falls "
        "back to a statistics-only graph dumper without step filter) and captured CUDA graphs bypass the hooks",
        wanted=fixed({f"{ROLLOUT}.enforce_eager": True}),
    ),
    Rule(
        "torchdynamo",
        "TORCHDYNAMO_DISABLE=1 in the environment (or in ray_kwargs.ray_init.runtime_env.env_vars)",
        "msprobe hooks do not fire inside TorchDynamo-compiled code, so compiled modules are missing from the dump",
        check=_torchdynamo,
    ),
    Rule(
        "ray-runtime-env",
        "a job joining a Ray cluster started apart (ray_init.address, RAY_ADDRESS) carries the hooks' variables in "
        "ray_kwargs.ray_init.runtime_env.env_vars (msprobe-hooks ray-env)",
        "the workers of a cluster started with `ray start` inherit its environment, not the driver's: without "
        "DUMP_ON and the shim on their PYTHONPATH no worker activates, and the job trains with no dump at all",
        check=_ray_cluster_apart,
    ),
    Rule(
        "prefix-caching",
        "actor_rollout_ref.rollout.enable_prefix_caching is False",
        "with n copies of one prompt, later requests reuse cached KV blocks and prefill only a few tokens, so "
        "their prefill dump does not cover the prompt",
        wanted=fixed({f"{ROLLOUT}.enable_prefix_caching": False}),
    ),
    Rule(
        "chunked-prefill",
        "actor_rollout_ref.rollout.enable_chunked_prefill is False",
        "chunked prefill splits a prompt over several steps (mixed with decodes), so no single inference step "
        "holds the prompt a training micro-batch holds",
        wanted=fixed({f"{ROLLOUT}.enable_chunked_prefill": False}),
    ),
    Rule(
        "training-strategy",
        "the actor strategy is fsdp, fsdp2 or megatron",
        "msprobe's consistency compare (--consistent_check --backend fsdp or megatron) maps module names for these "
        "training backends only",
        check=_strategy,
    ),
    Rule(
        "fsdp-rollout-parallel",
        "FSDP: rollout tensor_model_parallel_size is the number of cards and rollout data_parallel_size is 1",
        "every FSDP rank holds full activations of its own sample; one rollout replica spanning all cards makes "
        "both sides write rank0..rank{W-1}, so rank M pairs with rank M",
        wanted=_fsdp_parallel,
        strategies=FSDP_STRATEGIES,
    ),
    Rule(
        "megatron-rollout-parallel",
        "Megatron: ref and rollout TP, PP and EP equal the actor's",
        "with equal TP, PP and EP the layers are sharded identically, so rank M on each side holds the same shard",
        wanted=_megatron_parallel,
        strategies=(MEGATRON,),
    ),
    Rule(
        "virtual-pipeline",
        f"Megatron: {_VIRTUAL_PIPELINE} is null or 1 (no virtual pipeline parallelism)",
        f"{virtual_pipeline.REASON}; the Megatron engine patch refuses it at the first dumped pass, after the rollout",
        check=_virtual_pipeline,
        strategies=(MEGATRON,),
    ),
    Rule(
        "rollout-correction",
        "trim mode (PROMPTS_ONLY=trim, or 1 with Megatron pipeline parallelism): rollout correction is off "
        "(rollout_is, rollout_rs, rollout_rs_threshold null, rollout_is_batch_normalize False)",
        "trim mode cuts the responses off before old_log_prob, and rollout correction weighs response tokens "
        "by comparing exactly those log-probs with the rollout's",
        wanted=_rollout_correction,
        applies=lambda run: _prompts_only_mode(run) == prompts_only.TRIM,
        where_present=True,
    ),
    Rule(
        "megatron-prompts-only",
        "Megatron with PROMPTS_ONLY=1 (pipeline parallel size 1): router replay and dynamic context parallelism "
        "are off (or PROMPTS_ONLY=trim)",
        "the extra prompt-only forward would record or replay expert routes of its own, and a one-prompt forward "
        "does not fit a dynamic context-parallel layout; the Megatron engine patch refuses it at the first "
        "log-prob pass, after the rollout",
        wanted=_megatron_prompt_forward_blockers,
        applies=lambda run: _prompts_only_mode(run) == prompts_only.FORWARD,
        strategies=(MEGATRON,),
        where_present=True,
        in_recipe=False,  # off by default; a verl before 0.8 lacks them, and Hydra refuses to override a missing key
    ),
    Rule(
        "log-prob-recomputed",
        "when the log-prob phase is dumped: algorithm.rollout_correction.bypass_mode is False",
        "bypass mode takes the rollout's log-probs as old log-probs and never runs the actor log-prob forward, "
        "so DUMP_PHASE=log_prob dumps nothing",
        wanted=fixed({f"{_ROLLOUT_CORRECTION}.bypass_mode": False}),
        applies=lambda run: run.settings.phase_selected(LOG_PROB),
        where_present=True,
    ),
    Rule(
        "native-precision-debugger",
        "verl's own msprobe integration is off (global_profiler.tool and the actor/ref profiler.tool are not "
        "precision_debugger)",
        "msprobe's PrecisionDebugger is one per process: verl's stage-level dump would claim it with its own "
        "config and dump path, so the per-micro-batch dumps are lost or mixed into it",
        check=_native_debugger,
    ),
    Rule(
        "inference-dump-config",
        "an inference dump config for the rollout backend: vLLM-Ascend additional_config.dump_config_path; "
        "SGLang engine_kwargs.sglang.msprobe_dump_config (>= 0.5.11) or MSPROBE_GENERATE_CONFIG; GPU vLLM "
        "MSPROBE_GENERATE_CONFIG",
        "without it the rollout writes no dump, so there is nothing to pair the training dumps with",
        check=_inference_dump_config,
    ),
)
