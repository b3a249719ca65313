"""The trim and request-id patches through the real activation path: fresh interpreters, the shim,
``DUMP_ON=1 PROMPTS_ONLY=trim``, a local Ray cluster (2 CPUs) with verl's own load balancer and a
stand-in rollout server as Ray actors.

* v0 trainer: verl's AgentLoopWorker rolls out (single- and two-turn trajectories), then
  ``RayPPOTrainer._compute_old_log_prob`` and the two early-return functions run as ``fit`` runs them.
* v1 trainer: verl's AgentLoopWorkerTQ writes the trajectories to a real TransferQueue, then
  ``PPOTrainer._compute_old_log_prob`` trims them there before the (stand-in) actor reads them.

Each child prints one JSON report; the tests below assert on parts of it.
"""

from __future__ import annotations

import tempfile

import pytest
from support import STANDINS
from support.interpreter import run_python, shim_env

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

VERL_STANDINS = STANDINS / "verl_standins"

_COMMON = """
    import asyncio, json, os, sys
    import numpy as np, ray
    from verl_standins import ActorWorkerGroup, RolloutServer, job_config, make_model_dir
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import GlobalRequestLoadBalancer
    from msprobe_hooks import patching

    TEXTS = ["w5 w6 w7", "w8 w9"]
    AGENTS = ["single_turn_agent", "two_turn_agent"]
    tmp = os.environ["MH_TMP"]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=os.path.join(tmp, "ray"))
    server = ray.remote(RolloutServer).options(num_cpus=0).remote()
    balancer = ray.remote(GlobalRequestLoadBalancer).options(num_cpus=0).remote(servers={"s0": server})
    model_dir = make_model_dir(os.path.join(tmp, "model"))

    def calls_for(prompt_ids):
        calls = ray.get(server.get_calls.remote())
        return [c["request_id"] for c in calls if c["prompt_ids"][: len(prompt_ids)] == prompt_ids]
"""

V0_CHILD = (
    _COMMON
    + """
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.trainer.ppo import rollout_corr_helper
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.debug import metrics

    config = job_config(model_dir)
    worker = AgentLoopWorker(config, LLMServerClient(config, load_balancer_handle=balancer))
    trainer = object.__new__(RayPPOTrainer)
    trainer.config, trainer.actor_rollout_wg = config, ActorWorkerGroup()

    def step():
        prompts = DataProto.from_dict(non_tensors={
            "raw_prompt": np.array([[{"role": "user", "content": t}] for t in TEXTS], dtype=object),
            "index": np.arange(2), "agent_name": np.array(AGENTS, dtype=object)})
        prompts.meta_info["global_steps"] = 1
        batch = asyncio.run(worker.generate_sequences(prompts))
        old_log_prob, _ = trainer._compute_old_log_prob(batch)  # what fit() calls, then:
        old_log_prob.batch.pop("entropys")
        batch = batch.union(old_log_prob)
        correction = rollout_corr_helper.compute_rollout_correction_and_add_to_batch(batch, {"rollout_is": "token"})
        return batch, metrics.calculate_debug_metrics(batch), correction[1]

    batch, debug_metrics, correction_metrics = step()
    sent_to_engine = [calls_for([5, 6, 7]), calls_for([8, 9])]
    step()  # a second training step: the trim notice is not repeated
    print(json.dumps({
        "patches": {s.name: s.state for s in patching.status()},
        "seen_by_actor": trainer.actor_rollout_wg.seen[0],
        "request_id": list(batch.non_tensor_batch["request_id"]),
        "inference_request_ids": list(batch.non_tensor_batch["inference_request_ids"]),
        "sent_to_engine": sent_to_engine,
        "responses_shape": list(batch.batch["responses"].shape),
        "debug_metrics": debug_metrics,
        "correction_metrics": correction_metrics,
    }))
"""
)

V1_CHILD = (
    _COMMON
    + """
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from transfer_queue import KVBatchMeta
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import get_trajectory_info
    from verl.trainer.ppo.v1 import trainer_base
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.utils import tensordict_utils as tu

    # One storage unit: the controller and the unit then fit in the 2 CPUs this machine gives Ray.
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    config = job_config(model_dir, **{"actor_rollout_ref.rollout.n": 1})
    worker_cls = AgentLoopWorkerTQ.__ray_metadata__.modified_class.__ray_actor_class__  # run it in-process
    worker = worker_cls(config, LLMServerClient(config, load_balancer_handle=balancer))
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}

    async def rollout():
        trajectories = await get_trajectory_info(1, [0, 1], False)
        await asyncio.gather(*[
            worker._run_prompt(
                {"uid": f"uid{i}", "index": i, "global_steps": 1, "agent_name": AGENTS[i],
                 "raw_prompt": [{"role": "user", "content": TEXTS[i]}]},
                sampling, trajectory=trajectories[i])
            for i in range(2)])

    asyncio.run(rollout())
    keys = ["uid0_0_0", "uid1_0_0"]
    before = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["request_id", "inference_request_ids"])
    trainer = object.__new__(PPOTrainerSync)
    trainer.config, trainer.actor_rollout_wg = config, ActorWorkerGroup(tq=tq)
    step_metrics = {}
    trainer._compute_old_log_prob(KVBatchMeta(keys=keys, tags=[{}, {}], partition_id="train"), step_metrics)
    after = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["input_ids", "responses", "old_log_probs"])
    padded = DataProto(batch=after.select("responses").to_padded_tensor())
    _, correction_metrics = trainer_base.compute_rollout_correction_and_add_to_batch(padded, {"rollout_is": "token"})
    print(json.dumps({
        "patches": {s.name: s.state for s in patching.status()},
        "request_id": tu.get(before, "request_id"),
        "inference_request_ids": tu.get(before, "inference_request_ids"),
        "sent_to_engine": [calls_for([5, 6, 7]), calls_for([8, 9])],
        "seen_by_actor": trainer.actor_rollout_wg.seen[0],
        "input_ids_after": [row.tolist() for row in after["input_ids"].unbind()],
        "response_lengths_after": after["responses"].offsets().diff().tolist(),
        "old_log_prob_lengths": after["old_log_probs"].offsets().diff().tolist(),
        "step_metrics": {k: v for k, v in step_metrics.items() if k.startswith("training/")},
        "correction_metrics": correction_metrics,
    }))
    tq.close()
"""
)

TRIM_NOTICE = "the policy update of this run is meaningless (collection runs only)"
V0_PATCHES = ("verl.trim_ray_trainer", "verl.trim_debug_metrics", "verl.trim_rollout_correction")
REQUEST_ID_PATCHES = ("verl.request_id_llm_server", "verl.request_id_agent_loop")


def _run(code: str) -> tuple[dict, str]:
    with tempfile.TemporaryDirectory(prefix="mh-") as tmp:  # short: Ray's socket paths have a length limit
        env = shim_env(VERL_STANDINS, DUMP_ON="1", PROMPTS_ONLY="trim", MH_TMP=tmp)
        result = run_python(code, env, timeout=400)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.json(), result.stderr


@pytest.fixture(scope="module")
def v0() -> tuple[dict, str]:
    return _run(V0_CHILD)


@pytest.fixture(scope="module")
def v1() -> tuple[dict, str]:
    return _run(V1_CHILD)


def test_v0_patches_apply_through_the_shim(v0):
    report, stderr = v0
    for name in V0_PATCHES + REQUEST_ID_PATCHES:
        assert report["patches"][name] == "applied", name
    assert stderr.count(TRIM_NOTICE) == 1  # one line per process, though two steps were trimmed


def test_v0_request_ids_are_the_engine_ids_per_trajectory(v0):
    report, _ = v0
    single, two_turns = report["sent_to_engine"]
    assert len(single) == 1 and len(two_turns) == 2
    assert report["inference_request_ids"] == [single, two_turns]
    assert report["request_id"] == [single[0], two_turns[0]]
    assert report["seen_by_actor"]["request_id"] == report["request_id"]


def test_v0_actor_sees_prompts_only_and_the_metrics_return_early(v0):
    report, _ = v0
    seen = report["seen_by_actor"]
    assert seen["input_ids"] == [[5, 6, 7], [8, 9]] == seen["prompts"]
    assert report["responses_shape"] == [2, 0]
    assert report["debug_metrics"]["training/rollout_probs_diff_valid"] == 0
    assert report["debug_metrics"]["training/rollout_probs_diff_max"] == 0.0
    assert report["correction_metrics"] == {}


def test_v1_patches_apply_through_the_shim(v1):
    report, stderr = v1
    for name in ("verl.trim_v1_trainer", "verl.trim_debug_metrics") + REQUEST_ID_PATCHES:
        assert report["patches"][name] == "applied", name
    assert stderr.count(TRIM_NOTICE) == 1


def test_v1_request_ids_are_transfer_queue_fields(v1):
    report, _ = v1
    single, two_turns = report["sent_to_engine"]
    assert report["inference_request_ids"] == [single, two_turns]
    assert report["request_id"] == [single[0], two_turns[0]]
    assert report["seen_by_actor"]["request_id"] == report["request_id"]


def test_v1_samples_are_trimmed_in_transfer_queue_before_old_log_prob(v1):
    report, _ = v1
    assert report["seen_by_actor"]["input_ids"] == [[5, 6, 7], [8, 9]]
    assert report["input_ids_after"] == [[5, 6, 7], [8, 9]]
    assert report["response_lengths_after"] == [0, 0]
    assert report["old_log_prob_lengths"] == [0, 0]
    # calculate_debug_metrics ran inside the real _compute_old_log_prob and returned early.
    assert report["step_metrics"]["training/rollout_probs_diff_max"] == 0.0
    assert report["correction_metrics"] == {}
