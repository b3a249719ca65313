"""Actor micro-batch dumps in verl's Megatron engine (``verl.workers.engine.megatron.transformer_impl``).

Megatron's pipeline schedule owns the micro-batch loop, so the window is opened in
``MegatronEngineWithLMHead.forward_step`` (called by the schedule once per micro-batch, with 3
arguments before verl 0.8 and 4 since: only ``batch_iter`` and ``model`` come first in both) and
closed from ``postprocess_micro_batch_func`` (the schedule's loss function, which also receives
the micro-batch): at once in a log-prob pass, after the backward from its loss in an update.
``MegatronEngine.forward_backward_batch`` makes each call a pass.

With ``PROMPTS_ONLY=1`` (or ``DUMP_SEQUENCES=1``) and pipeline parallel size 1, ``forward_step``
of a log-prob pass takes the micro-batch out of ``batch_iter`` itself, runs the engine's own
``forward_step`` once per sample on that sample's prompt (whole sequence) alone (dumped, under
``no_grad``), then the real one on the same micro-batch (undumped). With pipeline parallelism the
schedule's point-to-point exchanges leave no room for an extra forward: ``prompts_only.mode`` makes
prompts-only a trim, done by the trainer; ``DUMP_SEQUENCES=1`` is refused.

In every log-prob pass of an actor, dumped or not, ``forward_step`` takes the micro-batch the same
way (as the schedule hands it, on the host) and ``postprocess_micro_batch_func``, given the
forward's log-probs, writes the samples' log-prob gap (``logprob_gap.jsonl``) after closing the
window. After the process's first actor forward (the last pipeline stage's), the engine's numerics settings go
to ``engine.jsonl`` (once): ``forward_step`` watches the output layer, ``postprocess_micro_batch_func`` writes.

Only the last pipeline stage dumps (it holds the output layer and the loss). The window binds
every model chunk of the rank. Refused clearly: virtual pipeline parallelism (a micro-batch's
forward and backward interleave with other micro-batches across chunks); ``PROMPTS_ONLY=1``
with pipeline parallelism on a batch the trainer did not trim; ``DUMP_SEQUENCES=1`` with pipeline
parallelism; ``PROMPTS_ONLY=1`` or ``DUMP_SEQUENCES=1`` with router replay or dynamic context
parallelism, whose per-micro-batch state an extra forward would disturb.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from msprobe_hooks import patching
from msprobe_hooks.config import LOG_PROB
from msprobe_hooks.join_keys import LAYER_OFFSET
from msprobe_hooks.training import engine_record, prompts_only, virtual_pipeline
from msprobe_hooks.training.actor_dump import MICRO_BATCH, DumpRefused, dumper, extra_forward_kinds
from msprobe_hooks.training.micro_batch import is_trimmed, packs_samples


def first_layer_offset(chunks: Any) -> int | None:
    """The global index of the first decoder layer of this rank's first model chunk (megatron-core's
    ``TransformerLayer.layer_number`` is global and counts from 1); None when it holds no decoder layer."""
    for chunk in chunks:
        for module in chunk.modules():
            layers = getattr(getattr(module, "decoder", None), "layers", None)
            if layers is not None and len(layers) and hasattr(layers[0], "layer_number"):
                return int(layers[0].layer_number) - 1
    return None


def _with_batch_iter(args: tuple, kwargs: dict, batch_iter: Any) -> tuple[tuple, dict]:
    """The ``forward_step`` arguments with ``batch_iter`` in place of the schedule's iterator."""
    if args:
        return (batch_iter, *args[1:]), kwargs
    return args, {**kwargs, "batch_iter": batch_iter}


def patch(module: ModuleType, ctx: patching.PatchContext) -> None:
    import torch
    from verl.utils.device import get_device_id

    mpu = getattr(module, "mpu", None)  # megatron.core.parallel_state, as the target imports it
    if mpu is None or not callable(getattr(mpu, "is_pipeline_last_stage", None)):
        raise patching.TargetChanged(f"{module.__name__} no longer imports megatron.core.parallel_state as mpu")
    value_head = module.MegatronEngineWithValueHead

    def is_actor(engine: Any) -> bool:
        return (
            not engine.engine_config.forward_only
            and not isinstance(engine, value_head)
            and mpu.is_pipeline_last_stage(ignore_virtual=True)
        )

    def prompts_only_mode(engine: Any) -> str:
        # The trainer reads the same size from actor.megatron, so both sides agree on trimming.
        return prompts_only.mode(ctx.config, engine.engine_config.pipeline_model_parallel_size)

    def refuse(instance: Any, phase: str, data: Any) -> None:
        if len(instance.module) > 1:
            raise DumpRefused(virtual_pipeline.refusal(len(instance.module)))
        if phase != LOG_PROB:
            return
        prompts = ctx.config.prompts_only == prompts_only.FORWARD
        sequences = ctx.config.dump_sequences
        pipeline = instance.engine_config.pipeline_model_parallel_size
        if sequences and pipeline > 1:
            raise DumpRefused(
                f"DUMP_SEQUENCES=1 with pipeline parallel size {pipeline} on the Megatron engine: the pipeline "
                "schedule leaves no room for an extra whole-sequence forward; set pipeline_model_parallel_size=1 "
                "for the collection run"
            )
        if prompts and prompts_only_mode(instance) == prompts_only.TRIM:
            if not is_trimmed(data):
                raise DumpRefused(
                    f"PROMPTS_ONLY=1 with pipeline parallel size {pipeline} on the Megatron engine: the batch "
                    "still has its responses (the trainer's trim did not run) and the pipeline schedule leaves "
                    "no room for an extra prompt-only forward; use PROMPTS_ONLY=trim (collection runs only)"
                )
            return
        if not (prompts or sequences):
            return
        switch = "PROMPTS_ONLY=1" if prompts else "DUMP_SEQUENCES=1"
        instead = ", or use PROMPTS_ONLY=trim" if prompts and not sequences else ""
        # Both keep per-micro-batch state in the engine that an extra forward would disturb:
        # recorded routes (R2) or replayed ones (R3); a context-parallel layout per micro-batch.
        if getattr(instance, "enable_routing_replay", False):  # verl >= 0.7.1
            raise DumpRefused(
                f"{switch} with router replay on the Megatron engine: an extra one-sample forward "
                "would record or replay routes of its own; set router_replay.mode=disabled for the "
                f"collection run{instead}"
            )
        if getattr(instance.engine_config, "dynamic_context_parallel", False):  # verl >= 0.8
            raise DumpRefused(
                f"{switch} with dynamic context parallelism on the Megatron engine: its micro-batches "
                "are laid out per context-parallel group, which a one-sample forward does not fit; set "
                f"dynamic_context_parallel=False for the collection run{instead}"
            )

    def packed(instance: Any, micro_batch: Any) -> bool:
        # verl pads each packed sequence to a multiple of TP x CP (and to 16 with FP8), and CP shards it.
        config = instance.engine_config
        parallel = getattr(config, "tensor_model_parallel_size", 1) * getattr(config, "context_parallel_size", 1)
        fp8 = getattr(getattr(instance, "tf_config", None), "fp8", None)
        return (
            packs_samples(micro_batch)
            and getattr(config, "use_remove_padding", True)
            and parallel == 1
            and fp8 not in ("e4m3", "hybrid")
        )

    def forward_backward_batch(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        return dumper().run_pass(ctx, wrapped, instance, args, kwargs, is_actor, refuse)

    def forward_step(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        actor_dumper = dumper()
        current = actor_dumper.begin_micro_batch(instance)
        if current is None:
            return wrapped(*args, **kwargs)
        ctx.guarded("watching the output layer", actor_dumper.watch_engine, current, engine_record.MEGATRON)
        if not (current.due or current.wants_gap):
            return wrapped(*args, **kwargs)
        # Take the micro-batch now (on the host, as the schedule hands it); the real forward_step gets it
        # back through an iterator of its own.
        micro_batch = next(patching.argument(args, kwargs, "batch_iter", 0))
        args, kwargs = _with_batch_iter(args, kwargs, iter([micro_batch]))
        if current.wants_gap:
            current.gap_batch = micro_batch  # for the postprocess of its real forward
        if not current.due:
            return wrapped(*args, **kwargs)
        if LAYER_OFFSET not in current.line_fields:
            current.line_fields[LAYER_OFFSET] = ctx.guarded(
                "reading the stage's first layer", first_layer_offset, instance.module, default=None
            )
        if current.phase == LOG_PROB:
            mode = ctx.guarded(
                "reading the engine's prompts-only mode", prompts_only_mode, instance, default=prompts_only.OFF
            )
            kinds = ctx.guarded(
                "reading the micro-batch's mode", extra_forward_kinds, ctx.config, mode, micro_batch, default=()
            )
            if kinds:

                def extra_forward(batch: Any) -> None:
                    # Its output and loss function are dropped: nothing of it reaches the schedule.
                    one_args, one_kwargs = _with_batch_iter(args, kwargs, iter([batch]))
                    with torch.no_grad():
                        wrapped(*one_args, **one_kwargs)

                ctx.guarded(
                    "the extra forwards",
                    actor_dumper.extra_forwards,
                    current,
                    micro_batch,
                    list(instance.module),
                    extra_forward,
                    instance.get_data_parallel_group(),
                    get_device_id(),
                    kinds,
                )
                return wrapped(*args, **kwargs)
        chosen = ctx.guarded("reading the requests", actor_dumper.holds_selected, current, micro_batch, default=True)
        if not chosen:  # DUMP_REQUEST_IDS names none of its samples
            return wrapped(*args, **kwargs)
        whole = ctx.guarded("reading the micro-batch's packing", packed, instance, micro_batch, default=False)
        # postprocess names the micro-batch (the device copy the forward used).
        actor_dumper.open(list(instance.module), current, MICRO_BATCH, packed=whole)
        try:
            return wrapped(*args, **kwargs)
        except BaseException:
            actor_dumper.close()
            raise

    def postprocess_micro_batch_func(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        actor_dumper = dumper()
        current = actor_dumper.current
        if current is None or current.engine is not instance:
            return wrapped(*args, **kwargs)
        window = current.due and actor_dumper.window_open
        if window:
            actor_dumper.attach(patching.argument(args, kwargs, "data", 1))
        result = wrapped(*args, **kwargs)
        if window:
            actor_dumper.forward_done(current.phase, result)
        ctx.guarded("the engine's settings", actor_dumper.record_engine, current, engine_record.MEGATRON, result)
        micro_batch, current.gap_batch = current.gap_batch, None
        if micro_batch is not None:  # after the window closed
            ctx.guarded("the log-prob gap", actor_dumper.log_prob_gap, current, micro_batch, result)
        return result

    ctx.wrap(module.MegatronEngine, "forward_backward_batch", forward_backward_batch)
    ctx.wrap(module.MegatronEngineWithLMHead, "forward_step", forward_step)
    ctx.wrap(module.MegatronEngineWithLMHead, "postprocess_micro_batch_func", postprocess_micro_batch_func)
