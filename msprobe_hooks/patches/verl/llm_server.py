"""Request ids in verl's rollout client (``verl.workers.rollout.llm_server``, verl >= 0.8).

``LLMServerClient._acquire_server`` hands ``generate`` a server handle that notes the request id of
each call, and ``generate`` returns its ``TokenOutput`` with ``extra_fields["request_id"]`` set to it.
``FullyAsyncLLMServerClient`` acquires and generates through these same methods, once per resumed
segment; the trajectory-level record (see ``verl_agent_loop``) keeps every segment's id.
"""

from __future__ import annotations

from types import ModuleType

from msprobe_hooks.patching import unwrap_method, wrap_method
from msprobe_hooks.training import request_ids

PATCH_NAME = "verl.request_id_llm_server"


def patch(module: ModuleType) -> None:
    wrap_method(module.LLMServerClient, "_acquire_server", request_ids.acquire_server, PATCH_NAME)
    wrap_method(module.LLMServerClient, "generate", request_ids.generate, PATCH_NAME)


def unpatch(module: ModuleType) -> None:
    unwrap_method(module.LLMServerClient, "_acquire_server", PATCH_NAME)
    unwrap_method(module.LLMServerClient, "generate", PATCH_NAME)
