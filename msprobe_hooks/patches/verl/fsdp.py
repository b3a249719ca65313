"""Actor micro-batch dumps in verl's FSDP engine (``verl.workers.engine.fsdp.transformer_impl``).

``FSDPEngine.forward_backward_batch`` is wrapped to make each call a pass (is it an actor pass
of the selected phase?); ``FSDPEngineWithLMHead.forward_step`` to dump each micro-batch of a due
pass: the micro-batch itself (its forward and, when updating, its backward: the window closes
when the backward from the returned loss finishes; with ``DUMP_REQUEST_IDS`` only a micro-batch
holding one of them), or with ``PROMPTS_ONLY=1`` / ``DUMP_SEQUENCES=1`` in a log-prob pass one
prompt-only / whole-sequence forward per sample, made with the engine's own ``forward_step`` (so
its own input packing, position ids and multi-modal inputs) before the real, undumped forward.
After the real forward of every micro-batch of an actor's log-prob pass, dumped or not, the
samples' log-prob gap goes to ``logprob_gap.jsonl`` (outside any msprobe window: our tensor work
stays out of the dumps). After the process's first actor forward, the engine's numerics settings go to
``engine.jsonl`` (once).

Our work in both wrappers runs guarded (:meth:`msprobe_hooks.patching.PatchContext.guarded`): an engine we
cannot read, a micro-batch layout we do not know, msprobe failing, each gives one line and the
engine's call runs unchanged.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from msprobe_hooks import patching
from msprobe_hooks.config import LOG_PROB
from msprobe_hooks.training import engine_record, prompts_only
from msprobe_hooks.training.actor_dump import MICRO_BATCH, dumper, extra_forward_kinds
from msprobe_hooks.training.micro_batch import packs_samples


def patch(module: ModuleType, ctx: patching.PatchContext) -> None:
    from verl.utils.device import get_device_id

    value_head = module.FSDPEngineWithValueHead

    def is_actor(engine: Any) -> bool:
        # The ref engine is forward-only by configuration; critics are value-head engines.
        return not engine.engine_config.forward_only and not isinstance(engine, value_head)

    def forward_backward_batch(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        return dumper().run_pass(ctx, wrapped, instance, args, kwargs, is_actor)

    def wanted_forwards(micro_batch: Any) -> tuple[str, ...]:
        return extra_forward_kinds(ctx.config, prompts_only.mode(ctx.config), micro_batch)

    def extra_forwards(current: Any, engine: Any, wrapped: Any, micro_batch: Any, kinds: tuple[str, ...]) -> None:
        dumper().extra_forwards(
            current,
            micro_batch,
            engine.module,
            lambda batch: wrapped(batch, loss_function=None, forward_only=True),
            engine.get_data_parallel_group(),
            get_device_id(),
            kinds,
        )

    def packed(engine: Any, micro_batch: Any) -> bool:
        # Ulysses sequence parallelism slices the packed row across ranks: a rank's dump holds a part of it.
        return packs_samples(micro_batch) and getattr(engine, "ulysses_sequence_parallel_size", 1) == 1

    def dumped_forward(current: Any, instance: Any, wrapped: Any, args: tuple, kwargs: dict, micro_batch: Any) -> Any:
        actor_dumper = dumper()
        if current.phase == LOG_PROB:
            kinds = ctx.guarded("reading the micro-batch's mode", wanted_forwards, micro_batch, default=())
            if kinds:
                ctx.guarded("the extra forwards", extra_forwards, current, instance, wrapped, micro_batch, kinds)
                return wrapped(*args, **kwargs)
        chosen = ctx.guarded("reading the requests", actor_dumper.holds_selected, current, micro_batch, default=True)
        if not chosen:  # DUMP_REQUEST_IDS names none of its samples
            return wrapped(*args, **kwargs)
        whole = ctx.guarded("reading the micro-batch's packing", packed, instance, micro_batch, default=False)
        actor_dumper.open(getattr(instance, "module", None), current, MICRO_BATCH, micro_batch, packed=whole)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException:
            actor_dumper.close()
            raise
        actor_dumper.forward_done(current.phase, result)
        return result

    def forward_step(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        actor_dumper = dumper()
        current = actor_dumper.begin_micro_batch(instance)  # None for a stand-in self: not our pass's engine
        if current is None:
            return wrapped(*args, **kwargs)
        micro_batch = patching.argument(args, kwargs, "micro_batch", 0, None)
        ctx.guarded("watching the output layer", actor_dumper.watch_engine, current, engine_record.FSDP)
        if current.due:
            result = dumped_forward(current, instance, wrapped, args, kwargs, micro_batch)
        else:
            result = wrapped(*args, **kwargs)
        ctx.guarded("the engine's settings", actor_dumper.record_engine, current, engine_record.FSDP, result)
        if current.wants_gap:  # after the window closed
            ctx.guarded("the log-prob gap", actor_dumper.log_prob_gap, current, micro_batch, result)
        return result

    ctx.wrap(module.FSDPEngine, "forward_backward_batch", forward_backward_batch)
    ctx.wrap(module.FSDPEngineWithLMHead, "forward_step", forward_step)
