"""Say clearly that verl's legacy actor worker is not dumped (``verl.workers.actor.dp_actor``, verl < 0.8).

verl 0.7 runs the legacy ``fsdp_workers``/``dp_actor`` path unless
``trainer.use_legacy_worker_impl=disable`` selects the engine workers, which is what the engine
patches dump. When a legacy actor is built, one line says so instead of a run without dumps.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from msprobe_hooks import patching
from msprobe_hooks.log import logger

MESSAGE = (
    "DUMP_ON=1: verl's legacy actor worker (dp_actor) is not supported and will not be dumped; "
    "set trainer.use_legacy_worker_impl=disable to run the engine workers"
)


def patch(module: ModuleType, ctx: patching.PatchContext) -> None:
    said = False

    def init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
        nonlocal said
        wrapped(*args, **kwargs)
        if not said:
            said = True
            logger().warning(MESSAGE)

    ctx.wrap(module.DataParallelPPOActor, "__init__", init)
