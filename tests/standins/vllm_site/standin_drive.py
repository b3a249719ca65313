"""Test driver (not a stand-in): run a scenario through the stand-in engine and report what happened.

``run(scenario)`` builds a VllmConfig from the scenario, adds each request before the step it is due
(``at_step``, with optional ``sampling`` parameters), steps until every request has finished and been freed
(``reload_at_step``: the worker loads its model again before that step; single process only), and returns
JSON-able facts:
this process's pid, the worker pids, the engine's id for each client id, each step's scheduled tokens,
each request's generated tokens. ``kill_worker_at_step``: at that step, hand the step to the (only)
worker process and SIGKILL it while it works.
"""

import os
import signal

from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
from vllm.v1.engine.llm_engine import LLMEngine


def make_config(scenario: dict) -> VllmConfig:
    return VllmConfig(
        model_config=ModelConfig(
            enforce_eager=scenario.get("enforce_eager", True),
            fail_on_forward=scenario.get("fail_on_forward"),
            hf_overrides=scenario.get("hf_overrides", {}),
        ),
        cache_config=CacheConfig(
            enable_prefix_caching=scenario.get("prefix_caching", False),
            cache_dtype=scenario.get("kv_cache_dtype", "auto"),
        ),
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=scenario.get("budget", 256), max_num_seqs=scenario.get("max_num_seqs", 8)
        ),
        parallel_config=ParallelConfig(
            world_size=scenario.get("world_size", 1),
            distributed_executor_backend=scenario.get("backend", "uni"),
            worker_cls=scenario.get("worker_cls", "vllm.v1.worker.gpu_worker.Worker"),
        ),
        additional_config=scenario.get("additional_config", {}),
        reorder_decodes_first=scenario.get("reorder_decodes_first", False),
    )


LAST_ENGINE = None  # the engine of the last run(), for a test to look at its model


def run(scenario: dict) -> dict:
    global LAST_ENGINE
    engine = LAST_ENGINE = LLMEngine(make_config(scenario))
    pending = sorted(scenario["requests"], key=lambda r: r.get("at_step", 0))
    ids, steps = {}, []
    executor = engine.model_executor
    worker_pids = getattr(executor, "worker_pids", [os.getpid()])
    while pending or engine.scheduler.has_requests():
        while pending and pending[0].get("at_step", 0) <= len(steps):
            request = pending.pop(0)
            ids[request["id"]] = engine.add_request(
                request["id"], request["prompt"], request.get("max_tokens", 2), request.get("sampling")
            )
        if scenario.get("reload_at_step") == len(steps):  # the worker loads its model anew (same process)
            executor.worker.load_model()
        if scenario.get("kill_worker_at_step") == len(steps):
            executor.connections[0].send(("execute_model", (engine.scheduler.schedule(),)))
            os.kill(worker_pids[0], signal.SIGKILL)
            executor.processes[0].join()
            return {"pid": os.getpid(), "worker_pids": worker_pids, "ids": ids, "steps": steps}
        output = engine.step()
        steps.append({"scheduled": output.num_scheduled_tokens, "total": output.total_num_scheduled_tokens})
    engine.shutdown()
    outputs = {client: engine.requests[internal].output_token_ids for client, internal in ids.items()}
    return {"pid": os.getpid(), "worker_pids": worker_pids, "ids": ids, "steps": steps, "outputs": outputs}
