"""Request ids from verl's real rollout client into the batch the trainer builds (in-process, no Ray).

verl's ``LLMServerClient`` / ``FullyAsyncLLMServerClient``, ``AgentLoopWorker`` (real single-turn agent
loop, tiny tokenizer) and ``RayPPOTrainer._compute_old_log_prob`` run for real; the rollout server,
the load balancer and the actor worker group are stand-ins reached as verl reaches them
(``handle.method.remote``). The server records every request id it receives.
"""

from __future__ import annotations

import asyncio
import sys

import numpy as np
import pytest
from support import STANDINS

from msprobe_hooks.join_keys import strip_vllm_suffix

sys.path.insert(0, str(STANDINS / "verl_standins"))

from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: E402
from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding  # noqa: E402
from verl_standins import (  # noqa: E402
    RESPONSE,
    TOOL_TOKENS,
    ActorWorkerGroup,
    Handle,
    LoadBalancer,
    RolloutServer,
    activated,
    job_config,
    make_model_dir,
)

PROMPTS = {"w5 w6 w7": [5, 6, 7], "w8 w9": [8, 9], "w10 w11 w12 w13": [10, 11, 12, 13]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_model_dir(str(tmp_path_factory.mktemp("model")))


@pytest.fixture
def dump_on():
    with activated():
        yield


def _client(config, server: RolloutServer, client_cls=LLMServerClient):
    return client_cls(config, load_balancer_handle=Handle(LoadBalancer(Handle(server))))


def _rollout(config, server: RolloutServer, agents: list[str], client_cls=LLMServerClient) -> DataProto:
    """What the v0 trainer gets from the agent loop: one trajectory per prompt of PROMPTS."""
    worker = AgentLoopWorker(config, _client(config, server, client_cls))
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array([[{"role": "user", "content": text}] for text in PROMPTS], dtype=object),
            "index": np.arange(len(PROMPTS)),
            "agent_name": np.array(agents, dtype=object),
        }
    )
    batch.meta_info["global_steps"] = 1
    return asyncio.run(worker.generate_sequences(batch))


def _ids_received(server: RolloutServer, prompt_ids: list[int]) -> list[str]:
    """The ids of the engine requests that served this prompt's trajectory, in order."""
    return [c["request_id"] for c in server.calls if c["prompt_ids"][: len(prompt_ids)] == prompt_ids]


def test_generate_returns_the_id_the_engine_received(dump_on, model_dir):
    server = RolloutServer()
    output = asyncio.run(
        _client(job_config(model_dir), server).generate("session-1", prompt_ids=[5, 6], sampling_params={})
    )
    (call,) = server.calls
    assert output.extra_fields["request_id"] == call["request_id"]
    assert call["request_id"] != "session-1"  # verl 0.9 sends a fresh id per turn
    assert strip_vllm_suffix(call["engine_request_id"]) == output.extra_fields["request_id"]


def test_full_determinism_ids_are_recorded_as_sent(dump_on, model_dir):
    server = RolloutServer()
    config = job_config(model_dir, **{"actor_rollout_ref.rollout.full_determinism": True})
    output = asyncio.run(_client(config, server).generate("det-0", prompt_ids=[5, 6], sampling_params={}))
    assert server.calls[0]["request_id"] == "det-0"
    assert output.extra_fields["request_id"] == "det-0"


def test_each_trajectory_carries_its_turns_ids_into_the_trainer_batch(dump_on, model_dir):
    server = RolloutServer()
    output = _rollout(job_config(model_dir), server, ["single_turn_agent", "two_turn_agent", "single_turn_agent"])

    expected = [_ids_received(server, prompt) for prompt in PROMPTS.values()]
    assert [len(ids) for ids in expected] == [1, 2, 1]
    two_turn = [c for c in server.calls if c["prompt_ids"][:2] == [8, 9]]
    assert two_turn[1]["prompt_ids"] == [8, 9, *RESPONSE, *TOOL_TOKENS]  # the second turn of that trajectory
    assert list(output.non_tensor_batch["inference_request_ids"]) == expected
    assert list(output.non_tensor_batch["request_id"]) == [ids[0] for ids in expected]

    # The trainer's conversion for the actor keeps them per sample, where the engine reads them.
    actor_batch = left_right_2_no_padding(output.to_tensordict())
    assert tu.get(actor_batch, "request_id") == [ids[0] for ids in expected]
    micro_batches = tu.chunk_tensordict(actor_batch, 3)
    assert [tu.get(mb, "request_id") for mb in micro_batches] == [[ids[0]] for ids in expected]

    trainer = object.__new__(RayPPOTrainer)
    trainer.config, trainer.actor_rollout_wg = job_config(model_dir), ActorWorkerGroup()
    trainer._compute_old_log_prob(output)
    assert trainer.actor_rollout_wg.seen[0]["request_id"] == [ids[0] for ids in expected]


def test_a_resumed_partial_rollout_keeps_every_segment_id(dump_on, model_dir):
    server = RolloutServer(abort_first=True)
    output = _rollout(
        job_config(model_dir), server, ["single_turn_agent"] * len(PROMPTS), client_cls=FullyAsyncLLMServerClient
    )
    for i, prompt in enumerate(PROMPTS.values()):
        segments = _ids_received(server, prompt)
        assert len(segments) == 2  # aborted, then resumed with the first token appended
        assert output.non_tensor_batch["inference_request_ids"][i] == segments
        assert output.non_tensor_batch["request_id"][i] == segments[0]


def test_nothing_is_added_without_activation(model_dir):
    with activated():
        pass
    server = RolloutServer()
    output = _rollout(job_config(model_dir), server, ["single_turn_agent"] * len(PROMPTS))
    assert "request_id" not in output.non_tensor_batch
    assert "inference_request_ids" not in output.non_tensor_batch
