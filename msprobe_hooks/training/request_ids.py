"""The rollout request id, exactly as the inference engine receives it, carried into the training batch.

verl gives the engine a fresh id per turn (``uuid4().hex``; ``det-…`` under full determinism;
verl 0.9's ``_vllm_request_id``) and drops it. We note the ``request_id`` argument of every
``server.generate.remote(...)`` call, through a thin proxy around the server handle the client
acquires, so what is recorded is what vLLM / SGLang saw (vLLM then appends its own ``-xxxxxxxx``
suffix internally; :func:`msprobe_hooks.join_keys.strip_vllm_suffix` undoes it on the other side).

Ids are collected per scope in a context variable (each asyncio task has its own): a scope per
``generate`` call, which stamps ``TokenOutput.extra_fields["request_id"]``, and a scope per agent-loop
trajectory, which stamps the trajectory's output with

* ``request_id``: the first id, the request whose prefill is the prompt alone (what a prompts-only
  training dump lines up with);
* ``inference_request_ids``: every id of the trajectory in order, one per turn, and one per resumed
  segment of a fully-async partial rollout.

From ``extra_fields`` verl copies both into ``DataProto.non_tensor_batch`` (v0 trainer); for the
v1 trainer they are also written as top-level TransferQueue fields. Either way the engine reads
them per sample from the micro-batch with ``tu.get(micro_batch, "request_id")``, falling back to
each sample's own ``extra_fields`` dict (v1) where the top-level field is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from msprobe_hooks.patching import PatchContext

REQUEST_ID = "request_id"
ALL_REQUEST_IDS = "inference_request_ids"

_scopes: ContextVar[tuple[list[str], ...]] = ContextVar("msprobe_hooks_request_id_scopes", default=())


@contextmanager
def collecting() -> Iterator[list[str]]:
    """A scope: yields the list of the request ids sent to an engine inside the block, in order."""
    sent: list[str] = []
    token = _scopes.set((*_scopes.get(), sent))
    try:
        yield sent
    finally:
        _scopes.reset(token)


def _note_sent(request_id: object) -> None:
    if request_id is not None:
        for sent in _scopes.get():
            sent.append(str(request_id))


def current() -> list[str]:
    """The ids of the innermost open scope (empty outside any)."""
    scopes = _scopes.get()
    return list(scopes[-1]) if scopes else []


class _NotingMethod:
    """``server.generate``, whose ``.remote(...)`` notes its ``request_id`` keyword first."""

    def __init__(self, method: Any, ctx: PatchContext) -> None:
        self._method = method
        self._ctx = ctx

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self._ctx.guarded("noting the request id sent", _note_sent, kwargs.get(REQUEST_ID))
        return self._method.remote(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._method, name)


class NotingServer:
    """A rollout server handle (a Ray actor handle) that notes the request id of each ``generate``."""

    def __init__(self, server: Any, ctx: PatchContext) -> None:
        self._server = server
        self._ctx = ctx

    @property
    def generate(self) -> _NotingMethod:
        return _NotingMethod(self._server.generate, self._ctx)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


def stamp_token_output(output: Any, sent: list[str]) -> None:
    """``TokenOutput.extra_fields["request_id"]`` = the id this generate call sent (as the published recipe)."""
    fields = getattr(output, "extra_fields", None)
    if sent and isinstance(fields, dict):
        fields[REQUEST_ID] = sent[0]


def stamp_trajectory(output: Any, sent: list[str]) -> None:
    """An agent-loop output's ``extra_fields`` get the trajectory's first id and the list of all."""
    fields = getattr(output, "extra_fields", None)
    if sent and isinstance(fields, dict):
        fields[REQUEST_ID] = sent[0]
        fields[ALL_REQUEST_IDS] = list(sent)


def promote(record: dict) -> None:
    """Top-level copies of the ids in a TransferQueue record; present (None) even when unknown,
    because every record of a partition must carry the same fields."""
    fields = record.get("extra_fields")
    fields = fields if isinstance(fields, dict) else {}
    record[REQUEST_ID] = fields.get(REQUEST_ID)
    record[ALL_REQUEST_IDS] = fields.get(ALL_REQUEST_IDS)


# --- wrappers shared by the patches of the clients that talk to the rollout servers ----------------


class ClientWrappers:
    """The wrappers of a rollout client's methods, for the patch whose context guards them.

    Our bookkeeping around a rollout call never reaches verl: a failure is reported (``ctx.guarded``).
    """

    def __init__(self, ctx: PatchContext) -> None:
        self.ctx = ctx

    def _noting(self, acquired: Any) -> Any:
        """The acquired server (a handle, or ``(server_id, handle)``) with its handle made noting."""
        if isinstance(acquired, tuple) and len(acquired) == 2:
            return acquired[0], NotingServer(acquired[1], self.ctx)
        return NotingServer(acquired, self.ctx)

    async def acquire_server(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        """Wrapper of the async ``_acquire_server`` (verl >= 0.7.1)."""
        return self._noting(await wrapped(*args, **kwargs))

    def choose_server(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        """Wrapper of the sync ``_choose_server`` (verl 0.7.0)."""
        return self._noting(wrapped(*args, **kwargs))

    async def generate(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        """Wrapper of the client's ``generate``: its output carries the id it sent to the engine."""
        with collecting() as sent:
            output = await wrapped(*args, **kwargs)
        self.ctx.guarded("stamping the TokenOutput with its request id", stamp_token_output, output, sent)
        return output
