"""PROMPTS_ONLY trim: ``compute_rollout_correction_and_add_to_batch`` returns early once the batch
was trimmed (no response tokens to weight or reject), with the batch unchanged and no metrics, as
the published recipe does."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from msprobe_hooks.patching import PatchContext, argument
from msprobe_hooks.training import prompts_only


def _compute_rollout_correction_and_add_to_batch(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if prompts_only.batch_trimmed():
        return argument(args, kwargs, "batch", 0, None), {}
    return wrapped(*args, **kwargs)


def patch(module: ModuleType, ctx: PatchContext) -> None:
    ctx.wrap(module, "compute_rollout_correction_and_add_to_batch", _compute_rollout_correction_and_add_to_batch)
