"""Training-side dumps: one msprobe step per dumped actor micro-batch, and its log line.

The verl engine patches (:mod:`msprobe_hooks.patches.verl.fsdp`,
:mod:`msprobe_hooks.patches.verl.megatron`) only find the places to call in; what happens there
lives here, shared by both engines:

* a *pass* is one ``forward_backward_batch`` call of an engine (a log-prob recomputation or one
  mini-batch of an update); :meth:`ActorDumper.run_pass` decides once whether it is dumped
  (``DUMP_PHASE``, actor engines only) and counts its micro-batches;
* a *window* is one msprobe step: ``start(model)`` → forward (→ backward) → ``stop()`` →
  ``step()``. A log line is written when the window closes, and only if msprobe really recorded
  it (its own ``step``/``rank`` filters may skip a window), with ``step`` equal to the msprobe
  ``step{N}`` folder;
* with ``PROMPTS_ONLY=1`` a log-prob micro-batch gets one extra, prompt-only forward per sample,
  with ``DUMP_SEQUENCES=1`` one over the sample's whole sequence, or both
  (:meth:`ActorDumper.extra_forwards`), each in its own window, while the real forward runs
  undumped; ``DUMP_REQUEST_IDS`` chooses the samples whose windows are dumped;
* every micro-batch of an actor's log-prob pass, dumped or not, gets its samples' log-prob gap
  (:meth:`ActorDumper.log_prob_gap`, ``logprob_gap.jsonl``, written by :mod:`.logprob_gap`) when it
  holds the rollout's log-probs.

Nothing here imports torch, verl or msprobe at import time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from msprobe_hooks import config as config_module
from msprobe_hooks import debugger as debugger_module
from msprobe_hooks import join_keys, patching, storage
from msprobe_hooks.jsonl import JsonlLog
from msprobe_hooks.log import logger
from msprobe_hooks.training import engine_record, logprob_gap, rank_claim, routed_experts
from msprobe_hooks.training.micro_batch import (
    SampleInfo,
    describe_samples,
    global_step_of,
    is_trimmed,
    prompt_only_batches,
    samples_and_step,
    selected,
    sequence_batches,
)

# What a window holds: the ``dump`` field of its log line.
MICRO_BATCH, PROMPT, SEQUENCE = join_keys.MICRO_BATCH_WINDOW, join_keys.PROMPT_WINDOW, join_keys.SEQUENCE_WINDOW
_EXTRA = {  # an extra forward's kind: its one-sample batches, what it is called in our lines, its switch
    PROMPT: (prompt_only_batches, "prompt-only", "PROMPTS_ONLY=1"),
    SEQUENCE: (sequence_batches, "sequence", "DUMP_SEQUENCES=1"),
}


class DumpRefused(patching.Refusal):
    """The run asks for a dump this setup cannot produce correctly; raised before any work is done."""


@dataclass
class Pass:
    """One ``forward_backward_batch`` call of one engine."""

    engine: object
    patch: patching.PatchContext  # the engine patch that made the pass: its guard reports our failures
    phase: str  # config.LOG_PROB or config.UPDATE_ACTOR
    due: bool
    actor: bool = False  # an actor engine's pass (dumped or not): its log-prob passes get the gap log
    micro_batch: int = -1  # index of the micro-batch in progress
    gap_batch: Any = None  # Megatron: the micro-batch taken in forward_step, for the gap in its postprocess
    line_fields: dict[str, Any] = field(default_factory=dict)  # the engine's own fields of its log lines

    @property
    def wants_gap(self) -> bool:
        return self.actor and self.phase == config_module.LOG_PROB


@dataclass
class DumpWindow:
    """One msprobe step of an actor micro-batch, from its ``start()`` to the ``step()`` that ends it, and
    what its log line will say (the inference side's counterpart is ``dispatch_log.StepWindow``)."""

    step: int
    recording: bool
    patch: patching.PatchContext
    fields: dict[str, Any]
    samples: list[SampleInfo] = field(default_factory=list)
    global_step: Any = None
    # Read when the step closes, outside msprobe's recording: our own tensor reads stay out of the dump.
    micro_batch: Any = None
    packed: bool = True  # the dumped input holds the samples back to back: their offsets index it


class ActorDumper:
    """The process's training-side dump state: its debugger, its log, the pass and window in progress."""

    def __init__(self) -> None:
        self.current: Pass | None = None
        self._window: DumpWindow | None = None
        self._debugger: Any = None
        self._log: JsonlLog | None = None
        self._gap_log = logprob_gap.GapLog(lambda cfg: self.dump_root(cfg)[1])
        self._engine_log = engine_record.EngineLog(lambda cfg: self.dump_root(cfg)[1])
        self._routers = routed_experts.RouterWatch(lambda cfg: self.dump_root(cfg)[1])
        self._root: tuple[str, str] | None = None  # (actor config path, training dump root)
        self._unreached: set[type] = set()  # engine classes already reported as never dumped
        self._rank_claimed = False  # the dump root's rank claimed at the first line (rank_claim)

    # --- configuration -------------------------------------------------------------------------

    def dump_root(self, cfg: config_module.Config) -> tuple[str, str]:
        """The actor config's path and the training dump root (its ``dump_path``, else the default), read once."""
        if self._root is None:
            path = cfg.actor_config or debugger_module.DEFAULT_ACTOR_CONFIG
            settings = config_module.read_msprobe_config("MSPROBE_ACTOR_CONFIG", path)
            self._root = (path, settings.get("dump_path") or cfg.actor_dump_root)
        return self._root

    def debugger(self, cfg: config_module.Config | None) -> Any:
        """The process's msprobe debugger for the actor config of ``cfg``; raises DebuggerUnavailable."""
        if self._debugger is None:
            if cfg is None:
                raise debugger_module.DebuggerUnavailable("msprobe-hooks is not active in this process")
            path, root = self.dump_root(cfg)
            self._debugger = debugger_module.get_debugger(path, root)
            self._log = JsonlLog(root, join_keys.TRAINING_LOG)
            logger().info("training dumps go to %s (log: %s)", root, self._log.path)
        return self._debugger

    @property
    def log_path(self) -> str | None:
        """This process's ``update_actor_log.jsonl``, once the first due micro-batch made the debugger."""
        return None if self._log is None else self._log.path

    # --- passes --------------------------------------------------------------------------------

    def run_pass(
        self,
        patch: patching.PatchContext,
        wrapped: Callable[..., Any],
        instance: Any,
        args: tuple,
        kwargs: dict,
        dumpable: Callable[[Any], bool],
        refuse: Callable[[Any, str, Any], None] | None = None,
    ) -> Any:
        """Run one ``forward_backward_batch(data, loss_function, forward_only=False)`` call as a pass.

        ``dumpable(engine)`` says whether the engine is one whose passes are dumped (an actor).
        ``refuse(engine, phase, data)``, called only when the pass is due, raises :class:`DumpRefused`
        for setups the engine patch cannot dump correctly, before any work is done. Any other
        failure of the decision is reported and the call runs unchanged, undumped.
        """
        engine, method_args = patching.bound(instance, args)
        decided = patch.guarded(
            "deciding whether the pass is dumped",
            self._decide,
            patch.config,
            engine,
            method_args,
            kwargs,
            dumpable,
            refuse,
        )
        if decided is None:
            return wrapped(*args, **kwargs)
        phase, due, actor = decided
        this = Pass(engine, patch, phase, due, actor)
        outer, self.current = self.current, this
        try:
            return wrapped(*args, **kwargs)
        finally:
            self.current = outer
            if due:
                self.close()
                if this.micro_batch < 0 and type(engine) not in self._unreached:
                    self._unreached.add(type(engine))
                    logger().warning(
                        "%s pass of %s reached no patched forward_step (the class overrides it?): nothing dumped",
                        phase,
                        type(engine).__qualname__,
                    )

    @staticmethod
    def _decide(
        cfg: config_module.Config | None,
        engine: Any,
        args: tuple,
        kwargs: dict,
        dumpable: Callable[[Any], bool],
        refuse: Callable[[Any, str, Any], None] | None,
    ) -> tuple[str, bool, bool]:
        """The pass's phase, whether it is due, and whether it is an actor's."""
        forward_only = patching.argument(args, kwargs, "forward_only", 2, False)
        phase = config_module.LOG_PROB if forward_only else config_module.UPDATE_ACTOR
        if cfg is None:
            return phase, False, False
        selected = cfg.phase_selected(phase)
        # Whether it is an actor's matters to a pass of the selected phase, and to every log-prob pass (the gap).
        actor = (selected or phase == config_module.LOG_PROB) and bool(dumpable(engine))
        due = actor and selected
        if due and refuse is not None:
            refuse(engine, phase, patching.argument(args, kwargs, "data", 0))
        return phase, due, actor

    def begin_micro_batch(self, engine: object) -> Pass | None:
        """The pass of ``engine`` (due or not: the gap log counts micro-batches too) with its micro-batch
        counter advanced, or None (not our pass's engine)."""
        current = self.current
        if current is None or current.engine is not engine:
            return None
        if current.due:
            self.close()  # a window whose backward never ran (or was not seen)
        current.micro_batch += 1
        return current

    # --- windows -------------------------------------------------------------------------------

    def open(self, model: Any, current: Pass, dump: str, micro_batch: Any = None, **known: Any) -> None:
        """``start(model)``: one msprobe step of ``current``'s micro-batch begins.

        ``dump`` says what it holds (:data:`MICRO_BATCH`, :data:`PROMPT` or :data:`SEQUENCE`); its samples
        are either ``known`` (``samples``, ``global_step``) or read from ``micro_batch`` when the step
        closes; ``packed`` (known) says whether the dumped input holds the samples back to back. When
        msprobe (or our bookkeeping) fails, one line says so and no step opens: the forward runs undumped.
        """
        current.patch.guarded("starting an msprobe step", self._open, model, current, dump, micro_batch, known)

    def _open(self, model: Any, current: Pass, dump: str, micro_batch: Any, known: dict[str, Any]) -> None:
        debugger = self.debugger(current.patch.config)
        self.close()
        step = debugger_module.next_step(debugger)
        debugger.start(model=model)
        fields = {"phase": current.phase, "micro_batch": current.micro_batch, "dump": dump, **current.line_fields}
        recording = debugger_module.is_recording()
        self._window = DumpWindow(step, recording, current.patch, fields, micro_batch=micro_batch, **known)
        if recording:
            current.patch.guarded("watching the MoE routers", self._routers.watch, current.patch.config, model)

    def attach(self, micro_batch: Any) -> None:
        """Name the micro-batch of the open window (Megatron: known only inside the schedule)."""
        if self._window is not None:
            self._window.micro_batch = micro_batch

    @property
    def window_open(self) -> bool:
        return self._window is not None

    def close(self, write: bool = True) -> None:
        """``stop()`` and ``step()``, then the log line if msprobe recorded this step (and ``write``).

        Never raises (but under ``MSPROBE_HOOKS_STRICT=1``).
        """
        window, self._window = self._window, None
        if window is not None:  # our bookkeeping must not break the training step
            window.patch.guarded("closing an msprobe step", self._close, window, write)

    def _close(self, window: DumpWindow, write: bool) -> None:
        debugger = self._debugger
        try:
            try:
                debugger.stop()
            except Exception:
                debugger_module.stop_recording(debugger)  # left recording, msprobe would run in the next forward
                raise
            debugger.step()
            if window.recording and write:
                self._write(window, debugger)
        finally:
            self._routers.release()  # hooks of a window that wrote no line, or failed

    def forward_done(self, phase: str, result: Any) -> None:
        """A micro-batch's forward returned ``result`` (``(loss, ...)``): close its window now in a
        log-prob pass, or once its backward has run in an update."""
        loss = result[0] if isinstance(result, tuple) and result else None
        window = self._window
        if (
            window is None
            or phase == config_module.LOG_PROB
            or not window.patch.guarded("waiting for the backward", self.close_after_backward, loss)
        ):
            self.close()

    def close_after_backward(self, loss: Any) -> bool:
        """Close the open window when the backward started from ``loss`` has finished.

        A hook on ``loss`` fires when its gradient is computed, i.e. as the backward begins; it
        queues a callback that autograd runs when the whole backward is done. False when ``loss``
        has no graph: there is no backward to wait for.
        """
        import torch

        if self._window is None or not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            return False
        window = self._window

        def on_backward(grad: Any) -> None:
            def finished() -> None:
                if self._window is window:
                    self.close()

            torch.autograd.Variable._execution_engine.queue_callback(finished)

        loss.register_hook(on_backward)
        return True

    def _write(self, window: DumpWindow, debugger: Any) -> None:
        samples, global_step = window.samples, window.global_step
        if window.micro_batch is not None:
            samples, global_step = self.describe(window.micro_batch, window.patch)
        if window.fields["dump"] != MICRO_BATCH:  # the sample alone: its input starts with it
            samples = [replace(s, offset=0) for s in samples]
        elif not window.packed:  # one padded row per sample, or sliced across ranks: no offset indexes it
            samples = [replace(s, offset=None) for s in samples]
        samples = [s for s in samples if not s.padding]
        request_ids = [sample.request_id for sample in samples if sample.request_id is not None]
        record = {
            "source": join_keys.TRAINING_SOURCE,
            "timestamp": join_keys.timestamp(),
            "pid": os.getpid(),
            "rank": debugger_module.dump_rank(debugger),
            "step": window.step,
            "global_step": global_step,
            **window.fields,
            "request_ids": request_ids,
            "num_requests": len(request_ids),
            "samples": [sample.as_record() for sample in samples],
            # ours, after the published fields: the prompt hashes' definition, and a clock to order lines by
            join_keys.PROMPT_HASH_VERSION_FIELD: join_keys.PROMPT_HASH_VERSION,
            "time": join_keys.clock(),
        }
        if not self._rank_claimed:  # the rank is known from the first recorded step on
            self._rank_claimed = True
            root = debugger_module.dump_root(debugger)
            other = window.patch.guarded("claiming the dump root's rank", rank_claim.claim, root, record["rank"])
            if other:
                logger().warning(other)
        assert self._log is not None
        try:
            self._log.write(record)
        except OSError as exc:  # a full or removed dump root: one line naming the cause and the step
            what = f"the {join_keys.TRAINING_LOG} line of step {window.step}"
            storage.report_loss(what, exc, self._log.path, patching.strict())
        window.patch.guarded(
            "writing the window's routed experts", self._routers.write, window.step, record["rank"], global_step
        )

    # --- the two kinds of micro-batch dump -----------------------------------------------------

    def describe(self, micro_batch: Any, patch: patching.PatchContext) -> tuple[list[SampleInfo], Any]:
        """The samples and global step of a micro-batch for its log line; ([], None) if unreadable
        (a layout we do not know: the dump stands, its line lacks the samples)."""
        return patch.guarded("reading the samples of a micro-batch", samples_and_step, micro_batch, default=([], None))

    def holds_selected(self, current: Pass, micro_batch: Any) -> bool:
        """Whether a plain micro-batch dump is wanted: no ``DUMP_REQUEST_IDS``, or a sample of it named there."""
        wanted = current.patch.config.dump_request_ids
        return not wanted or any(not s.padding and selected(s, wanted) for s in describe_samples(micro_batch))

    def extra_forwards(
        self,
        current: Pass,
        micro_batch: Any,
        model: Any,
        forward: Callable[[Any], Any],
        group: Any,
        device: Any,
        kinds: tuple[str, ...],
    ) -> None:
        """Per sample of ``micro_batch``, one ``forward`` of each of ``kinds`` (:data:`PROMPT` then
        :data:`SEQUENCE`: the sample's prompt alone, its whole sequence alone), each of a dumped sample in
        its own window.

        A sample is dumped unless it is padding or ``DUMP_REQUEST_IDS`` does not name it. Every rank of
        ``group`` must run the same number of forwards (FSDP all-gathers parameters in each), so the
        ranks agree, in one all-reduce, on the largest sample count of the group and on whether any rank
        failed to cut its batches (then none runs any). Ranks with fewer samples repeat their first
        sample undumped, and samples not dumped run undumped. Ranks with nothing to dump (msprobe
        finished for good, or no sample chosen) report 0, so a group where none has anything to dump
        skips the extra forwards. A forward that fails (one line; its window gets no log line) is
        replaced by the first sample's, undumped, for this and every later one: a failure before the
        forward's first collective (in preparing its inputs) keeps the ranks in step.
        """
        switches = " with ".join(_EXTRA[kind][2] for kind in kinds)
        try:
            samples = describe_samples(micro_batch)
            global_step = global_step_of(micro_batch)
        except Exception as exc:
            raise DumpRefused(f"{switches}: cannot find each sample's prompt in the micro-batch ({exc})") from exc
        cfg = current.patch.config
        debugger = self.debugger(cfg)
        finished = debugger_module.has_finished(debugger)
        dumped = [not s.padding and selected(s, cfg.dump_request_ids) and not finished for s in samples]
        what = " and ".join({PROMPT: "prompts", SEQUENCE: "sequences"}[kind] for kind in kinds)
        batches = current.patch.guarded(f"cutting the {what}", _cut, micro_batch, samples, kinds)
        mine = 0 if batches is None or not any(dumped) else len(samples)
        count, failed = agree_on_max([mine, int(batches is None)], group, device)
        if failed:
            return
        assert batches is not None
        broken = False  # a forward failed: the rest are the first sample's, undumped
        for k in range(count):
            own = k < len(samples)
            for kind in kinds:
                first = batches[kind][0]
                dump = own and dumped[k] and not broken
                batch = batches[kind][k] if own and not broken else first
                if dump:
                    self.open(model, current, kind, samples=[samples[k]], global_step=global_step)
                failure = current.patch.guarded(f"a {_EXTRA[kind][1]} forward", forward, batch, default=_FAILED)
                if failure is _FAILED:
                    broken = True
                    if dump:  # what msprobe holds of this window is no forward of the sample: no log line for it
                        self.close(write=False)
                        dump = False
                    forward(first)  # this forward's collectives, with the first sample: the ranks stay in step
                if dump:
                    self.close()

    # --- the engine's settings -----------------------------------------------------------------

    def watch_engine(self, current: Pass, engine_name: str) -> None:
        """Before a micro-batch's forward: at the process's first of an actor, watch its output layer for
        ``engine.jsonl`` (:mod:`.engine_record`); nothing once that line is written."""
        if current.actor and not self._engine_log.done:
            self._engine_log.watch(engine_name, current.engine)

    def record_engine(self, current: Pass, engine_name: str, result: Any) -> None:
        """After a watched forward returned ``result``: the process's ``engine.jsonl`` line; none under a dump root
        whose config msprobe refused (that root stays as it was: nothing of ours is written there)."""
        if (
            current.actor
            and not self._engine_log.done
            and not debugger_module.rejected(*self.dump_root(current.patch.config))
        ):
            self._engine_log.write(current.patch.config, engine_name, current.engine, result)

    # --- the log-prob gap ----------------------------------------------------------------------

    def log_prob_gap(self, current: Pass, micro_batch: Any, result: Any) -> None:
        """The ``logprob_gap.jsonl`` lines of one micro-batch of an actor's log-prob pass, one per sample
        (:class:`~msprobe_hooks.training.logprob_gap.GapLog` writes them).

        ``result`` is what the engine's forward returned for it (FSDP's ``forward_step``, Megatron's
        ``postprocess_micro_batch_func``). The root is the training dump's, found without making a
        debugger: the gap is logged whether or not anything is dumped.
        """
        self._gap_log.write(current.patch.config, current.micro_batch, micro_batch, result, current.due)


def extra_forward_kinds(cfg: config_module.Config, prompts_only_mode: str, micro_batch: Any) -> tuple[str, ...]:
    """The extra forwards a log-prob micro-batch gets, in order: none when the trainer trimmed it."""
    from msprobe_hooks.training import prompts_only

    kinds: tuple[str, ...] = (PROMPT,) if prompts_only_mode == prompts_only.FORWARD else ()
    if cfg.dump_sequences:
        kinds += (SEQUENCE,)
    return kinds if kinds and not is_trimmed(micro_batch) else ()


def _cut(micro_batch: Any, samples: list[SampleInfo], kinds: tuple[str, ...]) -> dict[str, list[Any]]:
    return {kind: _EXTRA[kind][0](micro_batch, samples) for kind in kinds}


_FAILED = object()  # what a guarded forward returns when it raised


def agree_on_max(values: list[int], group: Any, device: Any) -> list[int]:
    """The largest of each of ``values`` over the ranks of ``group`` (themselves when not distributed)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size(group) <= 1:
        return values
    tensor = torch.tensor(values, dtype=torch.long).to(device)  # as verl moves its own counts
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return [int(v) for v in tensor.tolist()]


_dumper: ActorDumper | None = None


def dumper() -> ActorDumper:
    """The process's :class:`ActorDumper`."""
    global _dumper
    if _dumper is None:
        _dumper = ActorDumper()
    return _dumper
