"""Refuse verl's own msprobe integration next to ours (``verl.utils.profiler.profile``).

With ``global_profiler.tool=precision_debugger`` verl creates msprobe's ``PrecisionDebugger``
itself. msprobe allows one per process and silently hands the second creator the first one's
object, so the two integrations would write into each other's dumps. The worker builds its
``DistProfiler`` when it starts: that is where this patch stops the run, with one line.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from msprobe_hooks import patching
from msprobe_hooks.training.actor_dump import DumpRefused


def patch(module: ModuleType, ctx: patching.PatchContext) -> None:
    def uses_msprobe(profiler: Any) -> bool:
        return profiler._tool == "precision_debugger" and bool(profiler._enable)

    def init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
        wrapped(*args, **kwargs)
        profiler = patching.bound(instance, args)[0]
        if ctx.guarded("reading the profiler's tool", uses_msprobe, profiler, default=False):
            raise DumpRefused(
                "DUMP_ON=1 and verl's global_profiler.tool=precision_debugger are both on: msprobe allows one "
                "debugger per process, so their dumps would corrupt each other; turn one of them off"
            )

    ctx.wrap(module.DistProfiler, "__init__", init)
