"""The patch catalogue: every built-in patch, as a declarative record.

Each record says what it patches (target module and symbols, through its contract), why, how,
and which upstream change would make it unnecessary, in the manner of vLLM-Ascend's
``patch/__init__.py``. The code of a patch lives in the module named by ``implementation`` and is
imported only when its target is. ``docs/patches.md`` (``python scripts/gen_docs.py``) and ``msprobe-hooks doctor``
are generated from this tuple.
"""

from __future__ import annotations

from ..contracts import Attribute, Function, Method
from ..registry import Patch

# --- verl: engine ---------------------------------------------------------------------------

_FSDP = "verl.workers.engine.fsdp.transformer_impl"
_MEGATRON = "verl.workers.engine.megatron.transformer_impl"
_TU = "verl.utils.tensordict_utils"

# What both engine patches read from a micro-batch and from the engine configuration.
_VERL_COMMON = (
    Attribute("verl.workers.config.engine", "EngineConfig", "forward_only"),
    Function(_TU, "get", ("tensordict", "key", "default")),
)


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
VERL_FSDP_ENGINE = Patch(
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
        Method(_FSDP, "FSDPEngineWithLMHead.forward_step", ("self", "micro_batch", "loss_function", "forward_only")),
        Method(_FSDP, "FSDPEngineWithLMHead.prepare_model_inputs", ("self", "micro_batch")),
        Attribute(_FSDP, "FSDPEngine", "engine_config"),
        Attribute(_FSDP, "FSDPEngine", "module"),
        Attribute(_FSDP, "FSDPEngineWithValueHead", "engine_config"),
        Function("verl.utils.device", "get_device_id", ()),
        Function(_TU, "index_select_tensor_dict", ("batch", "indices")),
        Function(_TU, "assign_non_tensor", ("tensor_dict",)),
        *_VERL_COMMON,
    ),
)


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
VERL_MEGATRON_ENGINE = Patch(
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
        Method(_MEGATRON, "MegatronEngine.forward_backward_batch", ("self", "data", "loss_function", "forward_only")),
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
)


# ** File: verl/utils/profiler/profile.py **
#   1. `DistProfiler.__init__`
#    Why:
#       verl's global_profiler.tool=precision_debugger creates msprobe's process-singleton
#       debugger too; both integrations in one process corrupt each other's dumps silently.
#    How:
#       After a worker's DistProfiler is built with that tool enabled, raise one clear error.
#    Future plan:
#       Remove when msprobe supports several debuggers per process.
VERL_NATIVE_PROFILER_GUARD = Patch(
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
)


# ** File: verl/workers/actor/dp_actor.py **
#   1. `DataParallelPPOActor.__init__`
#    Why:
#       verl 0.7 runs the legacy actor unless trainer.use_legacy_worker_impl=disable; it is not
#       dumped, and a run without dumps must not be silent.
#    How:
#       One warning line when a legacy actor is built.
#    Future plan:
#       Remove with verl 0.7 support (verl 0.8 removed the legacy workers).
VERL_LEGACY_ACTOR = Patch(
    name="verl.legacy_actor",
    target="verl.workers.actor.dp_actor",
    implementation="msprobe_hooks.patches.verl_legacy_actor",
    distribution="verl",
    versions=">=0.7,<0.8",
    why="The legacy worker path (default in verl 0.7) is not dumped; the user must hear so.",
    how="Wraps DataParallelPPOActor.__init__ to log once: set trainer.use_legacy_worker_impl=disable.",
    retire_when="verl 0.7 is no longer supported.",
    contract=(Method("verl.workers.actor.dp_actor", "DataParallelPPOActor.__init__", ("self", "config")),),
)

# --- verl: trainer ----------------------------------------------------------------------------

VERL_PREFLIGHT = Patch(
    name="verl.preflight",
    target="verl.utils.device",
    implementation="msprobe_hooks.patches.verl_preflight",
    distribution="verl",
    versions=">=0.7,<0.10",
    why="A consistency run that breaks one pairing constraint (batch sizes, n = DP, eager rollout, prefix "
    "caching, parallel layout, ...) trains and dumps as usual, but its dumps cannot be paired; without a "
    "check that is found out after the cluster time is spent.",
    how="Wraps verl.utils.device.auto_set_device(config), which every verl PPO entry point calls first with "
    "the composed Hydra config, in the driver, before ray.init (main_ppo runs as __main__ under python -m, so "
    "its own functions are out of reach; this one it imports by name). After the call returns, the rules of "
    "msprobe_hooks.preflight run on the config; MSPROBE_HOOKS_PREFLIGHT=error (default) raises with every "
    "finding, warn logs them. Configs without actor_rollout_ref.rollout (SFT, eval) are left alone.",
    retire_when="verl checks a consistency-dump mode itself (a config switch that enforces these settings; "
    "RFC verl#5808 on integrating debugging data collection).",
    contract=(Function("verl.utils.device", "auto_set_device", ("config",)),),
)

# --- SGLang ---------------------------------------------------------------------------------------

_SGLANG_VERSIONS = ">=0.5.2,<0.6"
_RUNNER = "sglang.srt.model_executor.model_runner"
_FORWARD_BATCH = "sglang.srt.model_executor.forward_batch_info"
_SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
_SERVER_ARGS = "sglang.srt.server_args"

SGLANG_MODEL_RUNNER = Patch(
    name="sglang.model_runner",
    target=_RUNNER,
    implementation="msprobe_hooks.patches.sglang_model_runner",
    distribution="sglang",
    versions=_SGLANG_VERSIONS,
    why="SGLang < 0.5.11 has no msprobe switch, and no SGLang version records which requests each "
    "forward held, so an inference prefill dump cannot be paired with the training micro-batch of "
    "the same prompt.",
    how="ModelRunner.__init__: refuse a dump that CUDA graphs would leave empty (naming the flag); "
    "< 0.5.11 with MSPROBE_GENERATE_CONFIG: take the process's msprobe debugger; >= 0.5.11: leave "
    "SGLang's --msprobe-dump-config debugger in charge, only moving its output under {dump_path}/{pid}. "
    "ModelRunner.forward: < 0.5.11 start(model, rank_id) / stop() around prefill (or all) forwards and "
    "step() after each; every version: one dispatch_log.jsonl line per forward (requests in token "
    "order, tokens, cached prefix, prompt hash, msprobe step).",
    retire_when="SGLang logs the requests of each forward next to its msprobe step (and support for "
    "SGLang < 0.5.11 is dropped).",
    contract=(
        Method(_RUNNER, "ModelRunner.__init__", ("self", "model_config", "mem_fraction_static", "gpu_id")),
        Method(_RUNNER, "ModelRunner.forward", ("self", "forward_batch")),
        Attribute(_RUNNER, "ModelRunner", "model"),
        Attribute(_RUNNER, "ModelRunner", "gpu_id", versions="<0.5.11"),
        Attribute(_RUNNER, "ModelRunner", "dp_size", versions="<0.5.11"),
        Attribute(_RUNNER, "ModelRunner", "msprobe_debugger", versions=">=0.5.11"),
        Attribute(_FORWARD_BATCH, "ForwardBatch", "forward_mode"),
        Attribute(_FORWARD_BATCH, "ForwardBatch", "batch_size"),
        Attribute(_FORWARD_BATCH, "ForwardBatch", "seq_lens_cpu"),
        Attribute(_FORWARD_BATCH, "ForwardBatch", "extend_seq_lens_cpu"),
        Attribute(_FORWARD_BATCH, "ForwardBatch", "extend_prefix_lens_cpu"),
        Attribute(_FORWARD_BATCH, "ForwardBatch", "rids", versions=">=0.5.10"),
        # The CUDA-graph switches, as sglang_model_runner.GRAPH_SWITCHES reads them.
        Attribute(_SERVER_ARGS, "ServerArgs", "disable_cuda_graph", versions="<0.5.11"),
        Attribute(_SERVER_ARGS, "ServerArgs", "enable_piecewise_cuda_graph", versions=">=0.5.4,<0.5.10"),
        Attribute(_SERVER_ARGS, "ServerArgs", "disable_piecewise_cuda_graph", versions=">=0.5.10,<0.5.14"),
        Attribute(_SERVER_ARGS, "ServerArgs", "msprobe_dump_config", versions=">=0.5.11,<0.5.14"),
    ),
)

SGLANG_FORWARD_BATCH = Patch(
    name="sglang.forward_batch",
    target=_FORWARD_BATCH,
    implementation="msprobe_hooks.patches.sglang_forward_batch",
    distribution="sglang",
    versions=_SGLANG_VERSIONS,
    why="ModelRunner.forward sees only the ForwardBatch, which holds no prompts and (before 0.5.10) "
    "no request ids; the dispatch log needs both.",
    how="ForwardBatch.init_new: after it returns, attach the id, prompt length, prompt hash and "
    "first-seen flag of each request of its batch (ModelWorkerBatch.reqs on 0.5.6-0.5.12, the "
    "ScheduleBatch on 0.5.13+, the sglang.schedule_batch tag before) to the new ForwardBatch.",
    retire_when="ForwardBatch carries the requests' prompt ids (or a hash of them) and request ids.",
    # The request fields it reads are in sglang.schedule_batch's contract: that module may still be
    # half-imported when this one's import hook runs (it imports forward_batch_info first).
    contract=(Method(_FORWARD_BATCH, "ForwardBatch.init_new", ("cls", "batch", "model_runner")),),
)

SGLANG_SCHEDULE_BATCH = Patch(
    name="sglang.schedule_batch",
    target=_SCHEDULE_BATCH,
    implementation="msprobe_hooks.patches.sglang_schedule_batch",
    distribution="sglang",
    versions=_SGLANG_VERSIONS,
    why="On SGLang 0.5.2-0.5.5 the ModelWorkerBatch has no requests, and on 0.5.2-0.5.3 the overlap "
    "scheduler runs the forward in another thread while the scheduler already changes its batch.",
    how="0.5.2-0.5.5: ScheduleBatch.get_model_worker_batch tags the worker batch it returns with its "
    "requests' identities, taken in the scheduler thread, for ForwardBatch.init_new to pick up. "
    "0.5.6+: nothing to wrap (the batch carries its requests); its contract still guards the request "
    "fields that sglang.forward_batch reads.",
    retire_when="Support for SGLang < 0.5.6 is dropped.",
    contract=(
        Method(_SCHEDULE_BATCH, "ScheduleBatch.get_model_worker_batch", ("self",), versions="<0.5.6"),
        Attribute(_SCHEDULE_BATCH, "ScheduleBatch", "reqs"),
        Attribute(_SCHEDULE_BATCH, "ModelWorkerBatch", "reqs", versions=">=0.5.6,<0.5.13"),
        Attribute(_SCHEDULE_BATCH, "Req", "rid"),
        Attribute(_SCHEDULE_BATCH, "Req", "origin_input_ids"),
    ),
)

PATCHES: tuple[Patch, ...] = (
    VERL_FSDP_ENGINE,
    VERL_MEGATRON_ENGINE,
    VERL_NATIVE_PROFILER_GUARD,
    VERL_LEGACY_ACTOR,
    VERL_PREFLIGHT,
    SGLANG_MODEL_RUNNER,
    SGLANG_FORWARD_BATCH,
    SGLANG_SCHEDULE_BATCH,
)
