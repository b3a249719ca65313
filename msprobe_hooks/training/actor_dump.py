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
* with ``PROMPTS_ONLY=1`` a log-prob micro-batch gets one extra, prompt-only forward per sample
  (:meth:`ActorDumper.prompt_only_forwards`), each in its own window, while the real forward
  runs undumped.

Nothing here imports torch, verl or msprobe at import time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from msprobe_hooks import config as config_module
from msprobe_hooks import debugger as debugger_module
from msprobe_hooks import join_keys, patching, storage
from msprobe_hooks.jsonl import JsonlLog
from msprobe_hooks.log import logger
from msprobe_hooks.training.micro_batch import (
    SampleInfo,
    describe_samples,
    global_step_of,
    prompt_only_batches,
    samples_and_step,
)


class DumpRefused(patching.Refusal):
    """The run asks for a dump this setup cannot produce correctly; raised before any work is done."""


@dataclass
class Pass:
    """One ``forward_backward_batch`` call of one engine."""

    engine: object
    patch: patching.PatchContext  # the engine patch that made the pass: its guard reports our failures
    phase: str  # config.LOG_PROB or config.UPDATE_ACTOR
    due: bool
    micro_batch: int = -1  # index of the micro-batch in progress


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


class ActorDumper:
    """The process's training-side dump state: its debugger, its log, the pass and window in progress."""

    def __init__(self) -> None:
        self.current: Pass | None = None
        self._window: DumpWindow | None = None
        self._debugger: Any = None
        self._log: JsonlLog | None = None
        self._unreached: set[type] = set()  # engine classes already reported as never dumped

    # --- configuration -------------------------------------------------------------------------

    def debugger(self, cfg: config_module.Config | None) -> Any:
        """The process's msprobe debugger for the actor config of ``cfg``; raises DebuggerUnavailable."""
        if self._debugger is None:
            if cfg is None:
                raise debugger_module.DebuggerUnavailable("msprobe-hooks is not active in this process")
            path = cfg.actor_config or debugger_module.DEFAULT_ACTOR_CONFIG
            settings = config_module.read_msprobe_config("MSPROBE_ACTOR_CONFIG", path)
            root = settings.get("dump_path") or cfg.actor_dump_root
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
        phase, due = decided
        this = Pass(engine, patch, phase, due)
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
    ) -> tuple[str, bool]:
        """The pass's phase and whether it is due."""
        forward_only = patching.argument(args, kwargs, "forward_only", 2, False)
        phase = config_module.LOG_PROB if forward_only else config_module.UPDATE_ACTOR
        due = bool(cfg is not None and cfg.phase_selected(phase) and dumpable(engine))
        if due and refuse is not None:
            refuse(engine, phase, patching.argument(args, kwargs, "data", 0))
        return phase, due

    def begin_micro_batch(self, engine: object) -> Pass | None:
        """The due pass of ``engine`` with its micro-batch counter advanced, or None (not dumped)."""
        current = self.current
        if current is None or not current.due or current.engine is not engine:
            return None
        self.close()  # a window whose backward never ran (or was not seen)
        current.micro_batch += 1
        return current

    # --- windows -------------------------------------------------------------------------------

    def open(self, model: Any, current: Pass, dump: str, micro_batch: Any = None, **known: Any) -> None:
        """``start(model)``: one msprobe step of ``current``'s micro-batch begins.

        ``dump`` says what it holds ("micro_batch" or "prompt"); its samples are either ``known``
        (``samples``, ``global_step``) or read from ``micro_batch`` when the step closes. When msprobe
        (or our bookkeeping) fails, one line says so and no step opens: the forward runs undumped.
        """
        current.patch.guarded("starting an msprobe step", self._open, model, current, dump, micro_batch, known)

    def _open(self, model: Any, current: Pass, dump: str, micro_batch: Any, known: dict[str, Any]) -> None:
        debugger = self.debugger(current.patch.config)
        self.close()
        step = debugger_module.next_step(debugger)
        debugger.start(model=model)
        fields = {"phase": current.phase, "micro_batch": current.micro_batch, "dump": dump}
        recording = debugger_module.is_recording()
        self._window = DumpWindow(step, recording, current.patch, fields, micro_batch=micro_batch, **known)

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
            debugger.stop()
        except Exception:
            debugger_module.stop_recording(debugger)  # left recording, msprobe would run in the host's next forward
            raise
        debugger.step()
        if window.recording and write:
            self._write(window, debugger)

    def forward_done(self, phase: str, result: Any) -> None:
        """A micro-batch's forward returned ``result`` (``(loss, ...)``): close its window now in a
        log-prob pass, or once its backward has run in an update."""
        loss = result[0] if isinstance(result, tuple) and result else None
        window = self._window
        waits = window is not None and phase != config_module.LOG_PROB
        if not (waits and window.patch.guarded("waiting for the backward", self.close_after_backward, loss)):
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
        samples = [s for s in samples if not s.padding]
        request_ids = [sample.request_id for sample in samples if sample.request_id is not None]
        record = {
            "source": join_keys.TRAINING_SOURCE,
            "timestamp": join_keys.timestamp(),
            "time": join_keys.clock(),
            "pid": os.getpid(),
            "rank": debugger_module.dump_rank(debugger),
            "step": window.step,
            "global_step": global_step,
            **window.fields,
            "request_ids": request_ids,
            "num_requests": len(request_ids),
            "samples": [sample.as_record() for sample in samples],
        }
        assert self._log is not None
        try:
            self._log.write(record)
        except OSError as exc:  # a full or removed dump root: one line naming the cause and the step
            what = f"the {join_keys.TRAINING_LOG} line of step {window.step}"
            storage.report_loss(what, exc, self._log.path, patching.strict())

    # --- the two kinds of micro-batch dump -----------------------------------------------------

    def describe(self, micro_batch: Any, patch: patching.PatchContext) -> tuple[list[SampleInfo], Any]:
        """The samples and global step of a micro-batch for its log line; ([], None) if unreadable
        (a layout we do not know: the dump stands, its line lacks the samples)."""
        return patch.guarded("reading the samples of a micro-batch", samples_and_step, micro_batch, default=([], None))

    def prompt_only_forwards(
        self,
        current: Pass,
        micro_batch: Any,
        model: Any,
        forward: Callable[[Any], Any],
        group: Any,
        device: Any,
    ) -> None:
        """One prompt-only ``forward`` per sample of ``micro_batch``, each real sample in its own window.

        Every rank of ``group`` must run the same number of forwards (FSDP all-gathers parameters
        in each), so the ranks agree, in one all-reduce, on the largest sample count of the group
        and on whether any rank failed to cut its prompts (then none runs any). Ranks with fewer
        samples repeat their first sample undumped, and padding samples run undumped. Ranks whose
        msprobe has finished for good report 0, so a group where all have finished skips the extra
        forwards. A forward that fails (one line; its window gets no log line) is replaced by the first
        sample's, undumped, for this and every later one: a failure before the forward's first
        collective (in preparing its inputs) keeps the ranks in step.
        """
        try:
            samples = describe_samples(micro_batch)
            global_step = global_step_of(micro_batch)
        except Exception as exc:
            raise DumpRefused(f"PROMPTS_ONLY=1: cannot find each sample's prompt in the micro-batch ({exc})") from exc
        debugger = self.debugger(current.patch.config)
        finished = debugger_module.has_finished(debugger)
        batches = current.patch.guarded("cutting the prompts", prompt_only_batches, micro_batch, samples)
        mine = 0 if finished or batches is None else len(batches)
        count, failed = agree_on_max([mine, int(batches is None)], group, device)
        if failed:
            return
        assert batches is not None
        broken = False  # a forward failed: the rest are the first sample's, undumped
        for k in range(count):
            dumped = k < len(batches) and not samples[k].padding and not (broken or finished)
            batch = batches[k] if k < len(batches) and not broken else batches[0]
            if dumped:
                self.open(model, current, "prompt", samples=[samples[k]], global_step=global_step)
            if current.patch.guarded("a prompt-only forward", forward, batch, default=_FAILED) is _FAILED:
                broken = True
                if dumped:  # what msprobe holds of this window is no prompt's forward: no log line for it
                    self.close(write=False)
                    dumped = False
                forward(batches[0])  # this forward's collectives, with the first prompt: the ranks stay in step
            if dumped:
                self.close()


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
