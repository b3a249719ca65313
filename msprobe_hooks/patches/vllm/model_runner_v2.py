"""vLLM's Model Runner V2: refused, with the switch that turns it off.

Patch ``vllm.model_runner_v2`` wraps ``vllm.v1.worker.gpu.model_runner.GPUModelRunner.__init__``.
V2 (vLLM 0.12+, the default for more and more models from 0.23) is a separate class with its own
request states and packing order (decodes first), and its internals still change from release to
release; msprobe-hooks follows the V1 runner only. A worker that builds a V2 runner logs one
error line naming ``VLLM_USE_V2_MODEL_RUNNER=0``; under ``MSPROBE_HOOKS_STRICT=1`` it fails.
"""

from __future__ import annotations

from typing import Any

from msprobe_hooks.log import logger
from msprobe_hooks.patching import PatchContext

MESSAGE = (
    "this vLLM worker runs Model Runner V2 ({cls}), which msprobe-hooks does not follow: no dispatch "
    "log and no msprobe dumps from it. Set VLLM_USE_V2_MODEL_RUNNER=0 (in every process of the job, "
    "e.g. in the Ray runtime_env) to use the V1 runner"
)


class ModelRunnerV2Refused(RuntimeError):
    """Raised from the V2 runner's constructor under MSPROBE_HOOKS_STRICT=1."""


def patch(module: Any, ctx: PatchContext) -> None:
    def init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        result = wrapped(*args, **kwargs)
        message = MESSAGE.format(cls=f"{type(instance).__module__}.{type(instance).__qualname__}")
        logger().error("%s", message)
        if ctx.config is not None and ctx.config.strict:
            raise ModelRunnerV2Refused(message)
        return result

    ctx.wrap(module.GPUModelRunner, "__init__", init)
