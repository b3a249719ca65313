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

PATCHES: tuple[Patch, ...] = (
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
)
