"""PROMPTS_ONLY trim in verl's v0 trainer (``RayPPOTrainer``, DataProto batches), and its global step.

The batch is cut in place on entry to ``_compute_old_log_prob``, so ``fit`` (which holds the same
DataProto) goes on with the prompt-only batch: ref log-probs, values, advantages and the update.
Subclasses that call it through ``super()`` (the fully-async and separation trainers) are covered.
For the call, the trainer's ``global_steps`` rides on the batch's ``meta_info`` under our own key
(``micro_batch.trainer_step_on``), so the log-prob pass's dumps and gap lines name verl's step.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from msprobe_hooks.patching import PatchContext, argument
from msprobe_hooks.training import micro_batch, prompts_only


def patch(module: ModuleType, ctx: PatchContext) -> None:
    def compute_old_log_prob(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        batch = argument(args, kwargs, "batch", 0, None)
        prompts_only.trim_before_old_log_prob(
            ctx,
            getattr(instance, "config", None),
            lambda: prompts_only.trim_padded(batch.batch),
        )
        with micro_batch.trainer_step_on(batch, getattr(instance, "global_steps", None)):
            return wrapped(*args, **kwargs)

    ctx.wrap(module.RayPPOTrainer, "_compute_old_log_prob", compute_old_log_prob)
