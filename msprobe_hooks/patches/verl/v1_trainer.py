"""PROMPTS_ONLY trim in verl's v1 trainer (TransferQueue, jagged TensorDicts; the default in 0.9).

The trainer holds only keys: on entry to ``PPOTrainer._compute_old_log_prob`` the batch's samples
are read from TransferQueue, cut per sample to their prompt, and the changed fields written back,
so the actor worker and every later step read the prompt-only samples.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from msprobe_hooks.patching import PatchContext, TargetChanged, argument
from msprobe_hooks.training import prompts_only


def _trim_in_transfer_queue(tq: Any, batch: Any) -> None:
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id)
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=prompts_only.trim_jagged(data))


def patch(module: ModuleType, ctx: PatchContext) -> None:
    tq = getattr(module, "tq", None)
    if not (hasattr(tq, "kv_batch_get") and hasattr(tq, "kv_batch_put")):
        raise TargetChanged("trainer_base no longer uses transfer_queue's kv_batch_get/kv_batch_put")

    def compute_old_log_prob(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        batch = argument(args, kwargs, "batch", 0, None)
        prompts_only.trim_before_old_log_prob(
            ctx,
            getattr(instance, "config", None),
            lambda: _trim_in_transfer_queue(tq, batch),
        )
        return wrapped(*args, **kwargs)

    ctx.wrap(module.PPOTrainer, "_compute_old_log_prob", compute_old_log_prob)
