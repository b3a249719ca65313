"""Request ids per agent-loop trajectory (``verl.experimental.agent_loop.agent_loop``).

Each ``_run_agent_loop`` call (one trajectory, in its own asyncio task) collects the ids of every
engine request it makes; ``_agent_loop_postprocess`` (v0 trainer) and ``AgentLoopOutput.as_dict``
(v1 trainer, which writes TransferQueue records) put them into the output. Before verl 0.8 the
rollout client lived here too (``AsyncLLMServerManager``) and is patched here as in ``verl_llm_server``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from msprobe_hooks.patching import PatchContext, TargetChanged, argument
from msprobe_hooks.training import request_ids

# Where the trajectory methods are defined: AgentLoopWorkerBase in verl 0.7.0, AgentLoopWorker since.
_WORKER_CLASSES = ("AgentLoopWorkerBase", "AgentLoopWorker")


async def _run_agent_loop(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    with request_ids.collecting():
        return await wrapped(*args, **kwargs)


def _worker_class(module: ModuleType) -> type:
    for name in _WORKER_CLASSES:
        cls = vars(module).get(name)
        if isinstance(cls, type) and "_run_agent_loop" in vars(cls):
            return cls
    raise TargetChanged("no agent-loop worker class defines _run_agent_loop")


def patch(module: ModuleType, ctx: PatchContext) -> None:
    def stamp_trajectory(output: Any) -> None:
        ctx.guarded("stamping the trajectory", request_ids.stamp_trajectory, output, request_ids.current())

    async def agent_loop_postprocess(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        stamp_trajectory(argument(args, kwargs, "output", 0, None))
        return await wrapped(*args, **kwargs)

    def as_dict(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        stamp_trajectory(instance)
        record = wrapped(*args, **kwargs)
        ctx.guarded("promoting the request ids in a TransferQueue record", request_ids.promote, record)
        return record

    worker = _worker_class(module)
    ctx.wrap(worker, "_run_agent_loop", _run_agent_loop)
    ctx.wrap(worker, "_agent_loop_postprocess", agent_loop_postprocess)
    if "as_dict" in vars(module.AgentLoopOutput):
        ctx.wrap(module.AgentLoopOutput, "as_dict", as_dict)
    manager = vars(module).get("AsyncLLMServerManager")
    if manager is not None:
        client = request_ids.ClientWrappers(ctx)
        if "_acquire_server" in vars(manager):
            ctx.wrap(manager, "_acquire_server", client.acquire_server)
        else:
            ctx.wrap(manager, "_choose_server", client.choose_server)
        ctx.wrap(manager, "generate", client.generate)
