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

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from msprobe_hooks import patching

REQUEST_ID = "request_id"
ALL_REQUEST_IDS = "inference_request_ids"

_F = TypeVar("_F", bound=Callable[..., None])

_scopes: ContextVar[tuple[list[str], ...]] = ContextVar("msprobe_hooks_request_id_scopes", default=())


def _never_raises(func: _F) -> _F:
    """Bookkeeping around a rollout call: a failure is reported (patching.guarded), never passed on to verl."""

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> None:
        patching.guarded("request ids", func.__name__, functools.partial(func, *args, **kwargs))

    return guarded  # type: ignore[return-value]


@contextmanager
def collecting() -> Iterator[list[str]]:
    """A scope: yields the list of the request ids sent to an engine inside the block, in order."""
    sent: list[str] = []
    token = _scopes.set((*_scopes.get(), sent))
    try:
        yield sent
    finally:
        _scopes.reset(token)


@_never_raises
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

    def __init__(self, method: Any) -> None:
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        _note_sent(kwargs.get(REQUEST_ID))
        return self._method.remote(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._method, name)


class NotingServer:
    """A rollout server handle (a Ray actor handle) that notes the request id of each ``generate``."""

    def __init__(self, server: Any) -> None:
        self._server = server

    @property
    def generate(self) -> _NotingMethod:
        return _NotingMethod(self._server.generate)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


@_never_raises
def stamp_token_output(output: Any, sent: list[str]) -> None:
    """``TokenOutput.extra_fields["request_id"]`` = the id this generate call sent (as the published recipe)."""
    fields = getattr(output, "extra_fields", None)
    if sent and isinstance(fields, dict):
        fields[REQUEST_ID] = sent[0]


@_never_raises
def stamp_trajectory(output: Any, sent: list[str]) -> None:
    """An agent-loop output's ``extra_fields`` get the trajectory's first id and the list of all."""
    fields = getattr(output, "extra_fields", None)
    if sent and isinstance(fields, dict):
        fields[REQUEST_ID] = sent[0]
        fields[ALL_REQUEST_IDS] = list(sent)


@_never_raises
def promote(record: dict) -> None:
    """Top-level copies of the ids in a TransferQueue record; present (None) even when unknown,
    because every record of a partition must carry the same fields."""
    fields = record.get("extra_fields")
    fields = fields if isinstance(fields, dict) else {}
    record[REQUEST_ID] = fields.get(REQUEST_ID)
    record[ALL_REQUEST_IDS] = fields.get(ALL_REQUEST_IDS)


# --- wrappers shared by the patches of the clients that talk to the rollout servers ----------------


def _noting(acquired: Any) -> Any:
    """The acquired server (a handle, or ``(server_id, handle)``) with its handle made noting."""
    if isinstance(acquired, tuple) and len(acquired) == 2:
        return acquired[0], NotingServer(acquired[1])
    return NotingServer(acquired)


async def acquire_server(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Wrapper of the async ``_acquire_server`` (verl >= 0.7.1)."""
    return _noting(await wrapped(*args, **kwargs))


def choose_server(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Wrapper of the sync ``_choose_server`` (verl 0.7.0)."""
    return _noting(wrapped(*args, **kwargs))


async def generate(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Wrapper of the client's ``generate``: its output carries the id it sent to the engine."""
    with collecting() as sent:
        output = await wrapped(*args, **kwargs)
    stamp_token_output(output, sent)
    return output
