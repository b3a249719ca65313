"""Request ids per agent-loop trajectory (``verl.experimental.agent_loop.agent_loop``).

Each ``_run_agent_loop`` call (one trajectory, in its own asyncio task) collects the ids of every
engine request it makes; ``_agent_loop_postprocess`` (v0 trainer) and ``AgentLoopOutput.as_dict``
(v1 trainer, which writes TransferQueue records) put them into the output. Before verl 0.8 the
rollout client lived here too (``AsyncLLMServerManager``) and is patched here as in ``verl_llm_server``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from msprobe_hooks.patching import TargetChanged, unwrap_method, wrap_method
from msprobe_hooks.training import request_ids

PATCH_NAME = "verl.request_id_agent_loop"

# Where the trajectory methods are defined: AgentLoopWorkerBase in verl 0.7.0, AgentLoopWorker since.
_WORKER_CLASSES = ("AgentLoopWorkerBase", "AgentLoopWorker")


async def _run_agent_loop(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    with request_ids.collecting():
        return await wrapped(*args, **kwargs)


async def _agent_loop_postprocess(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    request_ids.stamp_trajectory(args[0] if args else kwargs.get("output"), request_ids.current())
    return await wrapped(*args, **kwargs)


def _as_dict(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    request_ids.stamp_trajectory(instance, request_ids.current())
    record = wrapped(*args, **kwargs)
    request_ids.promote(record)
    return record


def _worker_class(module: ModuleType) -> type:
    for name in _WORKER_CLASSES:
        cls = vars(module).get(name)
        if isinstance(cls, type) and "_run_agent_loop" in vars(cls):
            return cls
    raise TargetChanged("no agent-loop worker class defines _run_agent_loop")


def patch(module: ModuleType) -> None:
    worker = _worker_class(module)
    wrap_method(worker, "_run_agent_loop", _run_agent_loop, PATCH_NAME)
    wrap_method(worker, "_agent_loop_postprocess", _agent_loop_postprocess, PATCH_NAME)
    if "as_dict" in vars(module.AgentLoopOutput):
        wrap_method(module.AgentLoopOutput, "as_dict", _as_dict, PATCH_NAME)
    manager = vars(module).get("AsyncLLMServerManager")
    if manager is not None:
        if "_acquire_server" in vars(manager):
            wrap_method(manager, "_acquire_server", request_ids.acquire_server, PATCH_NAME)
        else:
            wrap_method(manager, "_choose_server", request_ids.choose_server, PATCH_NAME)
        wrap_method(manager, "generate", request_ids.generate, PATCH_NAME)


def unpatch(module: ModuleType) -> None:
    for name in _WORKER_CLASSES:
        cls = vars(module).get(name)
        if isinstance(cls, type):
            unwrap_method(cls, "_run_agent_loop", PATCH_NAME)
            unwrap_method(cls, "_agent_loop_postprocess", PATCH_NAME)
    unwrap_method(module.AgentLoopOutput, "as_dict", PATCH_NAME)
    manager = vars(module).get("AsyncLLMServerManager")
    if manager is not None:
        for name in ("_acquire_server", "_choose_server", "generate"):
            unwrap_method(manager, name, PATCH_NAME)
