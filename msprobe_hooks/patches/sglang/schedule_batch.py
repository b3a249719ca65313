"""SGLang 0.5.2-0.5.5 ``ScheduleBatch.get_model_worker_batch``: tag the worker batch with its requests.

Before 0.5.6 the ModelWorkerBatch that travels from the scheduler to the model worker has no
``reqs``. On 0.5.2-0.5.3 the overlap scheduler runs the forward in a second thread, fed through a
queue, while the scheduler thread already changes the ScheduleBatch for the next step. So the
identities are taken here, in the scheduler thread, and ride on the worker batch itself (a plain
dataclass) to ``ForwardBatch.init_new`` in whichever thread runs it. From 0.5.6 the worker batch
(and from 0.5.13 the ScheduleBatch itself) reaches ``init_new`` with the requests, and this patch
has nothing to wrap.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from packaging.version import Version

from msprobe_hooks import patching
from msprobe_hooks.patches.sglang.forward_batch import REQUESTS_ATTR, identities

NAME = "sglang.schedule_batch"
_CARRIES_REQS_FROM = Version("0.5.6")


def _get_model_worker_batch(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    worker_batch = wrapped(*args, **kwargs)
    try:
        setattr(worker_batch, REQUESTS_ATTR, identities(instance.reqs))
    except Exception as exc:
        patching.report_failure(NAME, "tagging the worker batch with its requests", exc)
    return worker_batch


def _needed() -> bool:
    from msprobe_hooks.patches.sglang import model_runner as sglang_model_runner

    return sglang_model_runner.sglang_version() < _CARRIES_REQS_FROM


def patch(module: ModuleType) -> None:
    if _needed():
        patching.wrap_method(module.ScheduleBatch, "get_model_worker_batch", _get_model_worker_batch, NAME)


def unpatch(module: ModuleType) -> None:
    patching.unwrap_method(module.ScheduleBatch, "get_model_worker_batch", NAME)
