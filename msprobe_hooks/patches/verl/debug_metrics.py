"""PROMPTS_ONLY trim: ``calculate_debug_metrics`` returns early once the batch was trimmed.

It compares rollout and actor log-probs over the response tokens, which the trim removed; the
published recipe returns fixed zero metrics instead.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from msprobe_hooks.patching import PatchContext
from msprobe_hooks.training import prompts_only


def _calculate_debug_metrics(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if prompts_only.batch_trimmed():
        return dict(prompts_only.SKIPPED_DEBUG_METRICS)
    return wrapped(*args, **kwargs)


def patch(module: ModuleType, ctx: PatchContext) -> None:
    ctx.wrap(module, "calculate_debug_metrics", _calculate_debug_metrics)
