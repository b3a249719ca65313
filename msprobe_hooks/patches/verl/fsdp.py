"""Actor micro-batch dumps in verl's FSDP engine (``verl.workers.engine.fsdp.transformer_impl``).

``FSDPEngine.forward_backward_batch`` is wrapped to make each call a pass (is it an actor pass
of the selected phase?); ``FSDPEngineWithLMHead.forward_step`` to dump each micro-batch of a due
pass: the micro-batch itself (its forward and, when updating, its backward: the window closes
when the backward from the returned loss finishes), or with ``PROMPTS_ONLY=1`` in a log-prob
pass one prompt-only forward per sample, made with the engine's own ``forward_step`` (so its own
input packing, position ids and multi-modal inputs) before the real, undumped forward.

Our work in both wrappers runs guarded (:meth:`msprobe_hooks.patching.PatchContext.guarded`): an engine we
cannot read, a micro-batch layout we do not know, msprobe failing, each gives one line and the
engine's call runs unchanged.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from msprobe_hooks import patching
from msprobe_hooks.config import LOG_PROB
from msprobe_hooks.training import prompts_only
from msprobe_hooks.training.actor_dump import dumper
from msprobe_hooks.training.micro_batch import is_trimmed


def patch(module: ModuleType, ctx: patching.PatchContext) -> None:
    from verl.utils.device import get_device_id

    value_head = module.FSDPEngineWithValueHead

    def is_actor(engine: Any) -> bool:
        # The ref engine is forward-only by configuration; critics are value-head engines.
        return not engine.engine_config.forward_only and not isinstance(engine, value_head)

    def forward_backward_batch(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        return dumper().run_pass(ctx, wrapped, instance, args, kwargs, is_actor)

    def wants_prompt_forwards(micro_batch: Any) -> bool:
        forward_mode = prompts_only.mode(ctx.config) == prompts_only.FORWARD
        return forward_mode and not is_trimmed(micro_batch)

    def prompt_forwards(current: Any, engine: Any, wrapped: Any, micro_batch: Any) -> None:
        dumper().prompt_only_forwards(
            current,
            micro_batch,
            engine.module,
            lambda batch: wrapped(batch, loss_function=None, forward_only=True),
            engine.get_data_parallel_group(),
            get_device_id(),
        )

    def forward_step(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        state = dumper()
        current = state.begin_micro_batch(instance)  # None for a stand-in self: not our pass's engine
        if current is None:
            return wrapped(*args, **kwargs)
        micro_batch = patching.argument(args, kwargs, "micro_batch", 0)
        if current.phase == LOG_PROB and ctx.guarded(
            "reading the micro-batch's mode", wants_prompt_forwards, micro_batch, default=False
        ):
            ctx.guarded("the prompt-only forwards", prompt_forwards, current, instance, wrapped, micro_batch)
            return wrapped(*args, **kwargs)
        state.open(getattr(instance, "module", None), current, "micro_batch", micro_batch)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException:
            state.close()
            raise
        state.forward_done(current.phase, result)
        return result

    ctx.wrap(module.FSDPEngine, "forward_backward_batch", forward_backward_batch)
    ctx.wrap(module.FSDPEngineWithLMHead, "forward_step", forward_step)
