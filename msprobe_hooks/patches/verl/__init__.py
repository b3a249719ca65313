"""The verl patches' records: target, versions, contract, why / how / retire_when, and the module of each.

Importing this module imports none of the patch code and none of the targets. The code of each
record sits beside it, in the module its ``implementation`` names.
"""

from __future__ import annotations

from msprobe_hooks.contracts import Attribute, Function, Method
from msprobe_hooks.registry import Patch

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

# What the PROMPTS_ONLY=1 and DUMP_SEQUENCES=1 extra forwards of both engines use: the one-sample micro-batch
# (micro_batch.prompt_only_micro_batch) and the device of the forward-count all-reduce.
_PROMPT_FORWARD = (
    Function("verl.utils.device", "get_device_id", ()),
    Function(_TU, "index_select_tensor_dict", ("batch", "indices")),
    Function(_TU, "assign_non_tensor", ("tensor_dict",)),
)


VERL_FSDP_ENGINE = Patch(
    name="verl.fsdp_engine",
    target=_FSDP,
    implementation=f"{__name__}.fsdp",
    distribution="verl",
    versions=">=0.7,<0.10",
    why="verl's own msprobe integration dumps a whole stage at once: no micro-batch split, no "
    "prompt-only forward, no log joining a dump to its rollout requests.",
    how="Wraps FSDPEngine.forward_backward_batch (one pass per call: actor engine? DUMP_PHASE?) and "
    "FSDPEngineWithLMHead.forward_step (one msprobe step per micro-batch, closed after its backward; "
    "PROMPTS_ONLY=1 / DUMP_SEQUENCES=1: one extra prompt-only / whole-sequence forward_step per sample, "
    "dumped, before the real one; DUMP_REQUEST_IDS: only the samples named; after every real forward of "
    "an actor's log-prob pass, the samples' gap to the rollout's log-probs in logprob_gap.jsonl).",
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
    ran_for_real=("verl 0.9.1, its FSDP2 engine on CPU (tests/training/test_verl_fsdp_engine.py)",),
)


VERL_MEGATRON_ENGINE = Patch(
    name="verl.megatron_engine",
    target=_MEGATRON,
    implementation=f"{__name__}.megatron",
    distribution="verl",
    versions=">=0.7,<0.10",
    why="verl's own msprobe integration dumps a whole stage at once and binds only the first model chunk.",
    how="Wraps MegatronEngine.forward_backward_batch (one pass per call), MegatronEngineWithLMHead.forward_step "
    "(opens one msprobe step per micro-batch on the last pipeline stage, binding every model chunk) and "
    "postprocess_micro_batch_func (logs the micro-batch's samples; closes the step, after the backward in an "
    "update; in an actor's log-prob pass, the samples' gap to the rollout's log-probs in logprob_gap.jsonl). "
    "PROMPTS_ONLY=1 / DUMP_SEQUENCES=1 with PP = 1: one extra prompt-only / whole-sequence forward_step per "
    "sample of a log-prob micro-batch, dumped (DUMP_REQUEST_IDS: only the samples named), then the real one, "
    "undumped. Refuses virtual pipeline parallelism; with PROMPTS_ONLY=1, untrimmed batches under PP > 1; "
    "with DUMP_SEQUENCES=1, PP > 1; with either, router replay and dynamic context parallelism.",
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


VERL_NATIVE_PROFILER_GUARD = Patch(
    name="verl.native_profiler_guard",
    target="verl.utils.profiler.profile",
    implementation=f"{__name__}.native_profiler",
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


VERL_LEGACY_ACTOR = Patch(
    name="verl.legacy_actor",
    target="verl.workers.actor.dp_actor",
    implementation=f"{__name__}.legacy_actor",
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
    implementation=f"{__name__}.preflight",
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


PATCHES: tuple[Patch, ...] = (
    VERL_FSDP_ENGINE,
    VERL_MEGATRON_ENGINE,
    VERL_NATIVE_PROFILER_GUARD,
    VERL_LEGACY_ACTOR,
    Patch(
        name="verl.trim_ray_trainer",
        target=_RAY_TRAINER,
        implementation=f"{__name__}.ray_trainer",
        distribution="verl",
        versions=">=0.7,<0.10",
        why=_TRIM_WHY + " This is the v0 trainer (DataProto), also behind the fully-async trainer.",
        how="Wraps RayPPOTrainer._compute_old_log_prob: in trim mode the DataProto is cut in place "
        "first (input_ids, attention_mask, position_ids lose the response columns; responses, "
        "response_mask, rollout_log_probs become empty), so fit() goes on with the prompt-only batch. "
        "Not in bypass mode (no old_log_prob forward there). In every mode, for the call, the trainer's "
        "global_steps rides on the batch's meta_info under msprobe_hooks_global_step (taken off after): this "
        "trainer stamps no step before the pass, and the batch's per-sample global_steps is the rollout's weights' "
        "version, the step before.",
        retire_when="verl gains a prompt-only switch for the log-prob pass (none as of 0.9.1).",
        contract=(
            Method(_RAY_TRAINER, "RayPPOTrainer._compute_old_log_prob", ("self", "batch")),
            Attribute(_RAY_TRAINER, "RayPPOTrainer", "config"),
            Attribute("verl.protocol", "DataProto", "batch"),
            Attribute(_RAY_TRAINER, "RayPPOTrainer", "global_steps"),
            Attribute("verl.protocol", "DataProto", "meta_info"),
        ),
    ),
    Patch(
        name="verl.trim_v1_trainer",
        target=_V1_TRAINER,
        implementation=f"{__name__}.v1_trainer",
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
        implementation=f"{__name__}.debug_metrics",
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
        implementation=f"{__name__}.rollout_correction",
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
        implementation=f"{__name__}.llm_server",
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
        implementation=f"{__name__}.agent_loop",
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
)
