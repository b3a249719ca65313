"""Actor micro-batch dumps in verl's Megatron engine (``verl.workers.engine.megatron.transformer_impl``).

Megatron's pipeline schedule owns the micro-batch loop, so the window is opened in
``MegatronEngineWithLMHead.forward_step`` (called by the schedule once per micro-batch, with 3
arguments before verl 0.8 and 4 since: only ``batch_iter`` and ``model`` come first in both) and
closed from ``postprocess_micro_batch_func`` (the schedule's loss function, which also receives
the micro-batch): at once in a log-prob pass, after the backward from its loss in an update.
``MegatronEngine.forward_backward_batch`` makes each call a pass.

Only the last pipeline stage dumps (it holds the output layer and the loss). The window binds
every model chunk of the rank. Refused clearly: virtual pipeline parallelism (a micro-batch's
forward and backward interleave with other micro-batches across chunks) and ``PROMPTS_ONLY=1``
on a batch that still has its responses (no prompt-only extra forward here: use
``PROMPTS_ONLY=trim``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .. import bootstrap, patching
from ..actor_dump import DumpRefused, dumper, is_trimmed

PATCH_NAME = "verl.megatron_engine"


def patch(module: ModuleType) -> None:
    mpu = getattr(module, "mpu", None)  # megatron.core.parallel_state, as the target imports it
    if not callable(getattr(mpu, "is_pipeline_last_stage", None)):
        raise patching.TargetChanged(f"{module.__name__} no longer imports megatron.core.parallel_state as mpu")
    value_head = module.MegatronEngineWithValueHead

    def is_actor(engine: Any) -> bool:
        return (
            not engine.engine_config.forward_only
            and not isinstance(engine, value_head)
            and mpu.is_pipeline_last_stage(ignore_virtual=True)
        )

    def forward_backward_batch(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        def refuse(phase: str, data: Any) -> None:
            if len(instance.module) > 1:
                raise DumpRefused(
                    f"DUMP_ON=1 with virtual pipeline parallelism ({len(instance.module)} model chunks per rank) "
                    "is not supported: micro-batches interleave across chunks, so no dump can hold exactly one; "
                    "set virtual_pipeline_model_parallel_size to null for the collection run"
                )
            cfg = bootstrap.current_config()
            if phase == "log_prob" and cfg.prompts_only == "forward" and not is_trimmed(data):
                raise DumpRefused(
                    "PROMPTS_ONLY=1 on the Megatron engine: there is no prompt-only extra forward here; "
                    "use PROMPTS_ONLY=trim (the trainer cuts the responses off; collection runs only)"
                )

        return dumper().run_pass(PATCH_NAME, wrapped, instance, args, kwargs, is_actor(instance), refuse)

    def forward_step(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        state = dumper()
        current = state.begin_micro_batch(instance)
        if current is None:
            return wrapped(*args, **kwargs)
        # The micro-batch is next(batch_iter), taken inside; postprocess names it.
        state.open(list(instance.module), current, "micro_batch")
        try:
            return wrapped(*args, **kwargs)
        except BaseException:
            state.close()
            raise

    def postprocess_micro_batch_func(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        state = dumper()
        current = state.current
        if current is None or not current.due or current.engine is not instance or not state.window_open:
            return wrapped(*args, **kwargs)
        state.attach(kwargs["data"] if "data" in kwargs else args[1])
        result = wrapped(*args, **kwargs)
        state.forward_done(current.phase, result)
        return result

    patching.wrap_method(module.MegatronEngine, "forward_backward_batch", forward_backward_batch, PATCH_NAME)
    patching.wrap_method(module.MegatronEngineWithLMHead, "forward_step", forward_step, PATCH_NAME)
    patching.wrap_method(
        module.MegatronEngineWithLMHead, "postprocess_micro_batch_func", postprocess_micro_batch_func, PATCH_NAME
    )


def unpatch(module: ModuleType) -> None:
    patching.unwrap_method(module.MegatronEngineWithLMHead, "postprocess_micro_batch_func", PATCH_NAME)
    patching.unwrap_method(module.MegatronEngineWithLMHead, "forward_step", PATCH_NAME)
    patching.unwrap_method(module.MegatronEngine, "forward_backward_batch", PATCH_NAME)
