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
from msprobe_hooks.patches.sglang.forward_batch import carry

_CARRIES_REQS_FROM = Version("0.5.6")


def _tag(worker_batch: Any, schedule_batch: Any) -> None:
    carry(worker_batch, schedule_batch.reqs)


def patch(module: ModuleType, ctx: patching.PatchContext) -> None:
    from msprobe_hooks.patches.sglang.model_runner import release

    def get_model_worker_batch(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        worker_batch = wrapped(*args, **kwargs)
        ctx.guarded("tagging the worker batch with its requests", _tag, worker_batch, instance)
        return worker_batch

    if release(ctx) < _CARRIES_REQS_FROM:
        ctx.wrap(module.ScheduleBatch, "get_model_worker_batch", get_model_worker_batch)
