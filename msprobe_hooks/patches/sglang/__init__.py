"""The SGLang patches' records: target, versions, contract, why / how / retire_when, and the module of each.

Importing this module imports none of the patch code and none of the targets. The code of each
record sits beside it, in the module its ``implementation`` names.
"""

from __future__ import annotations

from msprobe_hooks.contracts import Attribute, Method
from msprobe_hooks.record import Record
from msprobe_hooks.registry import Patch

# --- SGLang ---------------------------------------------------------------------------------------

_SGLANG_VERSIONS = ">=0.5.2,<0.6"
_RUNNER = "sglang.srt.model_executor.model_runner"
_FORWARD_BATCH = "sglang.srt.model_executor.forward_batch_info"
_SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
_SERVER_ARGS = "sglang.srt.server_args"
_SGLANG_RAN_FOR_REAL = ("sglang 0.5.21 on CPU, its offline Engine (tests/inference/test_real_sglang.py)",)
NATIVE_FROM = "0.5.11"  # SGLang's own --msprobe-dump-config debugger
NATIVE_GRAPH_CHECK = f">={NATIVE_FROM},<0.5.14"  # native dumps that can still meet a graph: 0.5.14+ turns them off


class GraphSwitch(Record):
    """A ServerArgs field that leaves a CUDA graph on, in the SGLang versions that have it."""

    versions: str
    field: str
    graph_on: bool  # the value that means "graph on"
    fix: str  # how to turn it off


# What sglang.model_runner reads to refuse a dump that CUDA graphs would leave empty; its contract
# is generated from this table.
GRAPH_SWITCHES = (
    GraphSwitch(
        f"<{NATIVE_FROM}",
        "disable_cuda_graph",
        False,
        "start SGLang with --disable-cuda-graph (verl: actor_rollout_ref.rollout.enforce_eager=True)",
    ),
    GraphSwitch(
        ">=0.5.4,<0.5.10", "enable_piecewise_cuda_graph", True, "start SGLang without --enable-piecewise-cuda-graph"
    ),
    GraphSwitch(
        ">=0.5.10,<0.5.14",
        "disable_piecewise_cuda_graph",
        False,
        "start SGLang with --disable-piecewise-cuda-graph "
        "(verl: ++actor_rollout_ref.rollout.engine_kwargs.sglang.disable_piecewise_cuda_graph=True)",
    ),
)

SGLANG_MODEL_RUNNER = Patch(
    name="sglang.model_runner",
    target=_RUNNER,
    implementation=f"{__name__}.model_runner",
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
    "order, tokens, cached prefix, prompt hash, msprobe step). Beside it: engine.jsonl, one line once __init__ "
    "has loaded the model (the numerics settings read from the runner's model_config, resolved server_args, "
    "parallel sizes and loaded model: dtypes of the model, KV cache and lm_head, the log-probs mode SGLang's "
    "sampler returns, the effective HF config's numerics fields, the rotary modules' base, a config fingerprint), "
    "and requests.jsonl, the lines sglang.forward_batch made for the requests a forward holds for the first time.",
    retire_when="SGLang logs the requests of each forward next to its msprobe step (and support for "
    "SGLang < 0.5.11 is dropped).",
    contract=(
        Method(_RUNNER, "ModelRunner.__init__", ("self", "model_config", "mem_fraction_static", "gpu_id")),
        Method(_RUNNER, "ModelRunner.forward", ("self", "forward_batch")),
        Attribute(_RUNNER, "ModelRunner", "model"),
        Attribute(_RUNNER, "ModelRunner", "gpu_id", versions=f"<{NATIVE_FROM}"),
        Attribute(_RUNNER, "ModelRunner", "dp_size", versions=f"<{NATIVE_FROM}"),
        Attribute(_RUNNER, "ModelRunner", "msprobe_debugger", versions=f">={NATIVE_FROM}"),
        Attribute(_FORWARD_BATCH, "ForwardBatch", "forward_mode"),
        Attribute(_FORWARD_BATCH, "ForwardBatch", "batch_size"),
        Attribute(_FORWARD_BATCH, "ForwardBatch", "seq_lens_cpu"),
        Attribute(_FORWARD_BATCH, "ForwardBatch", "extend_seq_lens_cpu"),
        Attribute(_FORWARD_BATCH, "ForwardBatch", "extend_prefix_lens_cpu"),
        Attribute(_FORWARD_BATCH, "ForwardBatch", "rids", versions=">=0.5.10"),
        *(Attribute(_SERVER_ARGS, "ServerArgs", switch.field, versions=switch.versions) for switch in GRAPH_SWITCHES),
        Attribute(_SERVER_ARGS, "ServerArgs", "msprobe_dump_config", versions=NATIVE_GRAPH_CHECK),
    ),
    ran_for_real=_SGLANG_RAN_FOR_REAL,
)

SGLANG_FORWARD_BATCH = Patch(
    name="sglang.forward_batch",
    target=_FORWARD_BATCH,
    implementation=f"{__name__}.forward_batch",
    distribution="sglang",
    versions=_SGLANG_VERSIONS,
    why="ModelRunner.forward sees only the ForwardBatch, which holds no prompts and (before 0.5.10) "
    "no request ids; the dispatch log needs both.",
    how="ForwardBatch.init_new: after it returns, attach the id, prompt length, prompt hash and "
    "first-seen flag of each request of its batch (ModelWorkerBatch.reqs on 0.5.6-0.5.12, the "
    "ScheduleBatch on 0.5.13+, the sglang.schedule_batch tag before) to the new ForwardBatch, and the "
    "requests.jsonl line of each request first seen (its Req's sampling_params, return_logprob / "
    "top_logprobs_num and origin_input_ids).",
    retire_when="ForwardBatch carries the requests' prompt ids (or a hash of them) and request ids.",
    # The request fields it reads are in sglang.schedule_batch's contract: that module may still be
    # half-imported when this one's import hook runs (it imports forward_batch_info first).
    contract=(Method(_FORWARD_BATCH, "ForwardBatch.init_new", ("cls", "batch", "model_runner")),),
    ran_for_real=_SGLANG_RAN_FOR_REAL,
)

SGLANG_SCHEDULE_BATCH = Patch(
    name="sglang.schedule_batch",
    target=_SCHEDULE_BATCH,
    implementation=f"{__name__}.schedule_batch",
    distribution="sglang",
    versions=_SGLANG_VERSIONS,
    why="On SGLang 0.5.2-0.5.5 the ModelWorkerBatch has no requests, and on 0.5.2-0.5.3 the overlap "
    "scheduler runs the forward in another thread while the scheduler already changes its batch.",
    how="0.5.2-0.5.5: ScheduleBatch.get_model_worker_batch tags the worker batch it returns with its "
    "requests' identities (and the requests.jsonl lines of those first seen), taken in the scheduler thread, "
    "for ForwardBatch.init_new to pick up. "
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


PATCHES: tuple[Patch, ...] = (SGLANG_MODEL_RUNNER, SGLANG_FORWARD_BATCH, SGLANG_SCHEDULE_BATCH)
