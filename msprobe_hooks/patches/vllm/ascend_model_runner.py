"""vLLM-Ascend's NPUModelRunner: its native msprobe debugger, followed by the dispatch log.

Patch ``vllm_ascend.model_runner`` wraps ``vllm_ascend.worker.model_runner_v1.NPUModelRunner.__init__``.
vLLM-Ascend (0.12+) makes the process's ``PrecisionDebugger`` there from
``additional_config.dump_config_path`` and calls its ``start()``/``stop()``/``step()`` itself,
at places that moved between releases. After the constructor:

* the native debugger stays in charge (no second one is ever made); its dumps are redirected to
  ``{dump_path}/{pid}/`` so that worker processes never write the same folders;
* ``runner.debugger`` becomes a transparent proxy that reports each ``start()`` and ``step()``
  to the runner's dispatch-log state, wherever the release calls them, so every line's ``step``
  is the native ``step{N}`` folder and ``dumped`` says whether msprobe recorded it.

The requests of each step come from the ``vllm.model_runner`` patch (``NPUModelRunner`` inherits
``GPUModelRunner._update_states``, or calls it through ``super()``), which this patch requires.
This patch runs when the runner is built, after vLLM-Ascend has applied its own patches to vLLM.
"""

from __future__ import annotations

import os
from typing import Any

import wrapt

from msprobe_hooks import debugger as debugger_module
from msprobe_hooks.log import logger
from msprobe_hooks.patches.vllm import VLLM_MODEL_RUNNER
from msprobe_hooks.patches.vllm import model_runner as vllm_model_runner
from msprobe_hooks.patches.vllm.runner_state import VllmRunner, state_of
from msprobe_hooks.patching import PatchContext, TargetChanged

_roots: dict[int, str] = {}  # id of a native debugger -> its dump_path before we moved it under {pid}


class ObservedDebugger(wrapt.ObjectProxy):
    """vLLM-Ascend's debugger, unchanged, with its ``start()`` and ``step()`` reported to the dispatch log."""

    def __init__(self, wrapped: Any, state: VllmRunner, ctx: PatchContext) -> None:
        super().__init__(wrapped)
        self._self_state = state
        self._self_ctx = ctx

    def start(self, *args: Any, **kwargs: Any) -> Any:
        result = self.__wrapped__.start(*args, **kwargs)
        self._self_ctx.guarded("following the native start()", self._self_state.on_started)
        return result

    def step(self, *args: Any, **kwargs: Any) -> Any:
        result = self.__wrapped__.step(*args, **kwargs)
        self._self_ctx.guarded("following the native step()", self._self_state.on_stepped)
        return result


def follow_native_debugger(runner: Any, ctx: PatchContext) -> None:
    state = state_of(runner)
    cfg = ctx.config
    if state is None or cfg is None:
        return
    if cfg.generate_config:
        logger().warning(
            "MSPROBE_GENERATE_CONFIG is not used on vLLM-Ascend, which has its own msprobe switch: "
            "additional_config.dump_config_path"
        )
    native = getattr(runner, "debugger", None)
    if native is None:
        return  # no dump config: the dispatch log alone, under the default generate dump root
    if native is not debugger_module.existing():
        logger().warning(
            "vLLM-Ascend dumps through %s (graph mode), whose steps msprobe-hooks does not follow: "
            "dispatch-log steps are its own count, not dump folders. Run eager (%s) to align prefill dumps",
            type(native).__name__,
            vllm_model_runner.EAGER_HINT,
        )
        return
    root = _roots.get(id(native))
    if root is None:  # the first runner of this process to see the (process-wide) debugger
        root = _roots[id(native)] = os.path.abspath(debugger_module.dump_root(native))
        debugger_module.set_dump_root(native, os.path.join(root, str(os.getpid())))
    state.follow(native, root)
    runner.debugger = ObservedDebugger(native, state, ctx)


def patch(module: Any, ctx: PatchContext) -> None:
    def init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        result = wrapped(*args, **kwargs)
        ctx.guarded("following vLLM-Ascend's debugger", follow_native_debugger, instance, ctx)
        return result

    from vllm.v1.worker import gpu_model_runner

    if not issubclass(module.NPUModelRunner, gpu_model_runner.GPUModelRunner):
        raise TargetChanged("NPUModelRunner no longer derives from vLLM's GPUModelRunner")
    if not vllm_model_runner.is_applied(gpu_model_runner):
        raise TargetChanged(f"needs patch {VLLM_MODEL_RUNNER.name}, which is not applied")
    ctx.wrap(module.NPUModelRunner, "__init__", init)
