"""The patch catalogue: every built-in patch, as a declarative record.

Each record says what it patches (target module and symbols, through its contract), why, how,
and which upstream change would make it unnecessary, in the manner of vLLM-Ascend's
``patch/__init__.py``. The code of a patch lives in the module named by ``implementation`` and is
imported only when its target is. ``docs/patches.md`` and ``msprobe-hooks doctor`` are generated
from this tuple.
"""

from __future__ import annotations

from ..contracts import Attribute, Function, Method
from ..registry import Patch

_FSDP = "verl.workers.engine.fsdp.transformer_impl"
_MEGATRON = "verl.workers.engine.megatron.transformer_impl"
_TU = "verl.utils.tensordict_utils"

# What both engine patches read from a micro-batch and from the engine configuration.
_VERL_COMMON = (
    Attribute("verl.workers.config.engine", "EngineConfig", "forward_only"),
    Function(_TU, "get", ("tensordict", "key", "default")),
)

PATCHES: tuple[Patch, ...] = (
    # ** File: verl/workers/engine/fsdp/transformer_impl.py **
    #   1. `FSDPEngine.forward_backward_batch` and `FSDPEngineWithLMHead.forward_step`
    #    Why:
    #       Dumping per micro-batch needs a start/stop/step around each micro-batch's forward (and
    #       its backward in an update), which verl only offers per whole stage.
    #    How:
    #       forward_backward_batch marks a pass (actor engine, DUMP_PHASE selected); forward_step
    #       opens an msprobe step per micro-batch, or with PROMPTS_ONLY=1 runs one extra,
    #       dumped, prompt-only forward_step per sample before the real, undumped one.
    #    Future plan:
    #       Remove when verl's precision_debugger profiler can dump per micro-batch (and per
    #       prompt) with a step log.
    Patch(
        name="verl.fsdp_engine",
        target=_FSDP,
        implementation="msprobe_hooks.patches.verl_fsdp",
        distribution="verl",
        versions=">=0.7,<0.10",
        why="verl's own msprobe integration dumps a whole stage at once: no micro-batch split, no "
        "prompt-only forward, no log joining a dump to its rollout requests.",
        how="Wraps FSDPEngine.forward_backward_batch (one pass per call: actor engine? DUMP_PHASE?) and "
        "FSDPEngineWithLMHead.forward_step (one msprobe step per micro-batch, closed after its backward; "
        "PROMPTS_ONLY=1: one extra prompt-only forward_step per sample, dumped, before the real one).",
        retire_when="verl's precision_debugger profiler dumps per micro-batch and per prompt and logs each dump.",
        contract=(
            Method(_FSDP, "FSDPEngine.forward_backward_batch", ("self", "data", "loss_function", "forward_only")),
            Method(_FSDP, "FSDPEngine.get_data_parallel_group", ("self",)),
            Method(
                _FSDP, "FSDPEngineWithLMHead.forward_step", ("self", "micro_batch", "loss_function", "forward_only")
            ),
            Method(_FSDP, "FSDPEngineWithLMHead.prepare_model_inputs", ("self", "micro_batch")),
            Attribute(_FSDP, "FSDPEngine", "engine_config"),
            Attribute(_FSDP, "FSDPEngine", "module"),
            Attribute(_FSDP, "FSDPEngineWithValueHead", "engine_config"),
            Function("verl.utils.device", "get_device_id", ()),
            Function(_TU, "index_select_tensor_dict", ("batch", "indices")),
            Function(_TU, "assign_non_tensor", ("tensor_dict",)),
            *_VERL_COMMON,
        ),
    ),
    # ** File: verl/workers/engine/megatron/transformer_impl.py **
    #   1. `MegatronEngine.forward_backward_batch`, `MegatronEngineWithLMHead.forward_step` and
    #      `MegatronEngineWithLMHead.postprocess_micro_batch_func`
    #    Why:
    #       As for FSDP; Megatron's pipeline schedule owns the micro-batch loop.
    #    How:
    #       forward_step (called by the schedule per micro-batch) opens the msprobe step; the
    #       schedule's loss function (postprocess_micro_batch_func) names the samples and closes it,
    #       after the backward in an update. Last pipeline stage only; all model chunks bound.
    #    Future plan:
    #       As for FSDP.
    Patch(
        name="verl.megatron_engine",
        target=_MEGATRON,
        implementation="msprobe_hooks.patches.verl_megatron",
        distribution="verl",
        versions=">=0.7,<0.10",
        why="verl's own msprobe integration dumps a whole stage at once and binds only the first model chunk.",
        how="Wraps MegatronEngine.forward_backward_batch (one pass per call), MegatronEngineWithLMHead.forward_step "
        "(opens one msprobe step per micro-batch on the last pipeline stage, binding every model chunk) and "
        "postprocess_micro_batch_func (logs the micro-batch's samples; closes the step, after the backward in an "
        "update). Refuses virtual pipeline parallelism and PROMPTS_ONLY=1 on untrimmed batches.",
        retire_when="verl's precision_debugger profiler dumps per micro-batch and logs each dump.",
        contract=(
            Method(
                _MEGATRON, "MegatronEngine.forward_backward_batch", ("self", "data", "loss_function", "forward_only")
            ),
            Method(
                _MEGATRON,
                "MegatronEngineWithLMHead.forward_step",
                ("self", "batch_iter", "model", "postprocess_micro_batch_func"),
                versions="<0.8",
            ),
            Method(
                _MEGATRON,
                "MegatronEngineWithLMHead.forward_step",
                ("self", "batch_iter", "model", "logits_processor_func", "postprocess_micro_batch_func"),
                versions=">=0.8",
            ),
            Method(
                _MEGATRON,
                "MegatronEngineWithLMHead.postprocess_micro_batch_func",
                ("self", "output", "data", "forward_only", "loss_function"),
            ),
            Attribute(_MEGATRON, "MegatronEngine", "engine_config"),
            Attribute(_MEGATRON, "MegatronEngine", "module"),
            Attribute(_MEGATRON, "MegatronEngineWithValueHead", "engine_config"),
            *_VERL_COMMON,
        ),
    ),
    # ** File: verl/utils/profiler/profile.py **
    #   1. `DistProfiler.__init__`
    #    Why:
    #       verl's global_profiler.tool=precision_debugger creates msprobe's process-singleton
    #       debugger too; both integrations in one process corrupt each other's dumps silently.
    #    How:
    #       After a worker's DistProfiler is built with that tool enabled, raise one clear error.
    #    Future plan:
    #       Remove when msprobe supports several debuggers per process.
    Patch(
        name="verl.native_profiler_guard",
        target="verl.utils.profiler.profile",
        implementation="msprobe_hooks.patches.verl_native_profiler",
        distribution="verl",
        versions=">=0.8,<0.10",
        why="msprobe allows one PrecisionDebugger per process and silently shares it with a second creator.",
        how="Wraps DistProfiler.__init__: with tool precision_debugger enabled, the worker stops at start "
        "with one line asking to turn one of the two off.",
        retire_when="msprobe supports several independent debuggers per process.",
        contract=(
            Method("verl.utils.profiler.profile", "DistProfiler.__init__", ("self", "rank", "config")),
            Attribute("verl.utils.profiler.profile", "DistProfiler", "_tool"),
            Attribute("verl.utils.profiler.profile", "DistProfiler", "_enable"),
        ),
    ),
    # ** File: verl/workers/actor/dp_actor.py **
    #   1. `DataParallelPPOActor.__init__`
    #    Why:
    #       verl 0.7 runs the legacy actor unless trainer.use_legacy_worker_impl=disable; it is not
    #       dumped, and a run without dumps must not be silent.
    #    How:
    #       One warning line when a legacy actor is built.
    #    Future plan:
    #       Remove with verl 0.7 support (verl 0.8 removed the legacy workers).
    Patch(
        name="verl.legacy_actor",
        target="verl.workers.actor.dp_actor",
        implementation="msprobe_hooks.patches.verl_legacy_actor",
        distribution="verl",
        versions=">=0.7,<0.8",
        why="The legacy worker path (default in verl 0.7) is not dumped; the user must hear so.",
        how="Wraps DataParallelPPOActor.__init__ to log once: set trainer.use_legacy_worker_impl=disable.",
        retire_when="verl 0.7 is no longer supported.",
        contract=(Method("verl.workers.actor.dp_actor", "DataParallelPPOActor.__init__", ("self", "config")),),
    ),
)
