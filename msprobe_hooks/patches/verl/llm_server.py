"""Request ids in verl's rollout client (``verl.workers.rollout.llm_server``, verl >= 0.8).

``LLMServerClient._acquire_server`` hands ``generate`` a server handle that notes the request id of
each call, and ``generate`` returns its ``TokenOutput`` with ``extra_fields["request_id"]`` set to it.
``FullyAsyncLLMServerClient`` acquires and generates through these same methods, once per resumed
segment; the trajectory-level record (see ``verl_agent_loop``) keeps every segment's id.
"""

from __future__ import annotations

from types import ModuleType

from msprobe_hooks.patching import PatchContext
from msprobe_hooks.training import request_ids


def patch(module: ModuleType, ctx: PatchContext) -> None:
    wrappers = request_ids.ClientWrappers(ctx)
    ctx.wrap(module.LLMServerClient, "_acquire_server", wrappers.acquire_server)
    ctx.wrap(module.LLMServerClient, "generate", wrappers.generate)
