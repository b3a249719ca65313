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

from msprobe_hooks import bootstrap, join_keys, patching, storage
from msprobe_hooks import config as config_module
from msprobe_hooks import debugger as debugger_module
from msprobe_hooks.jsonl import JsonlLog
from msprobe_hooks.log import logger
from msprobe_hooks.training.request_ids import ALL_REQUEST_IDS, REQUEST_ID

LOG_FILENAME = "update_actor_log.jsonl"
LOG_SOURCE = "update_actor"  # the published recipe's value
PADDING_UID_PREFIX = "pad"  # verl's trainer/ppo/padding_utils.py names its filler samples "pad<hex>"


class DumpRefused(patching.Refusal):
    """The run asks for a dump this setup cannot produce correctly; raised before any work is done."""


@dataclass(frozen=True)
class SampleInfo:
    """What the log says about one sample of a micro-batch (the join keys of ``align``)."""

    index: int
    uid: str | None
    session_id: Any
    request_id: str | None  # the rollout request whose prefill is this prompt alone (the first turn)
    request_ids: list[str]  # every request of the trajectory, one per turn (or resumed segment)
    prompt_len: int
    prompt_hash: str
    seq_len: int

    @property
    def padding(self) -> bool:
        return isinstance(self.uid, str) and self.uid.startswith(PADDING_UID_PREFIX)

    def as_record(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uid": self.uid,
            "session_id": self.session_id,
            "request_id": self.request_id,
            "request_ids": self.request_ids,
            "prompt_len": self.prompt_len,
            "prompt_hash": self.prompt_hash,
            "seq_len": self.seq_len,
        }


@dataclass
class Pass:
    """One ``forward_backward_batch`` call of one engine."""

    engine: object
    patch: patching.PatchContext  # the engine patch that made the pass: its guard reports our failures
    phase: str  # config.LOG_PROB or config.UPDATE_ACTOR
    due: bool
    micro_batch: int = -1  # index of the micro-batch in progress


@dataclass
class StepWindow:
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


def _plain(value: Any) -> Any:
    """JSON-friendly scalars from tensors and numpy values."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0:
        return item()
    return value


def _first(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return _first(value[0]) if value else None
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return _first(tolist())
    return _plain(value)


def _per_sample(value: Any, count: int) -> list[Any]:
    """A per-sample field as a list of ``count`` plain values (None when absent)."""
    if value is None:
        return [None] * count
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        value = tolist()
    if isinstance(value, (list, tuple)) and len(value) == count:
        return [_plain(v) for v in value]
    return [_plain(value)] * count


def _request_ids(value: Any) -> list[str]:
    """One sample's request id(s) as a list: one id per turn in multi-turn rollouts."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value if v is not None]
    return [str(value)]


def _lengths(tensor: Any) -> list[int]:
    """Per-sample lengths of a jagged tensor, or the width of every row of a dense one."""
    if tensor.is_nested:
        return [int(n) for n in tensor.offsets().diff().tolist()]
    return [int(tensor.shape[-1])] * int(tensor.shape[0])


def prompt_lengths(micro_batch: Any) -> list[int]:
    """Prompt length of each sample, for both trainer layouts.

    v1 (TransferQueue): ``prompts`` is jagged, or dense when every prompt happens to have the same
    length. v0 (DataProto): ``prompts`` is dense and left-padded, ``attention_mask`` is kept.
    Otherwise: sequence length minus response length.
    """
    prompts = micro_batch.get("prompts", None)
    if prompts is not None:
        if prompts.is_nested:
            return _lengths(prompts)
        mask = micro_batch.get("attention_mask", None)
        if mask is not None and not mask.is_nested:
            return [int(n) for n in mask[:, : prompts.shape[-1]].sum(-1).tolist()]
        return _lengths(prompts)
    responses = micro_batch.get("response_mask", micro_batch.get("responses", None))
    if responses is None:
        raise ValueError("the micro-batch has neither 'prompts' nor 'responses'/'response_mask'")
    return [s - r for s, r in zip(_lengths(micro_batch["input_ids"]), _lengths(responses), strict=True)]


def is_trimmed(micro_batch: Any) -> bool:
    """Whether the trainer already cut the responses off (``PROMPTS_ONLY=trim``): every response is empty."""
    responses = micro_batch.get("responses", None)
    if responses is None:
        return False
    if responses.is_nested:
        return all(n == 0 for n in _lengths(responses))
    return responses.shape[-1] == 0


def _sample_field(micro_batch: Any, key: str, count: int) -> list[Any]:
    """A per-sample field, from the top level or else from the sample's ``extra_fields`` dict.

    verl's v1 (TransferQueue) records keep ``extra_fields`` as one dict per sample, where the
    published recipe stamps ``request_id``; the top-level copy exists only where our promotion ran
    (not with a custom agent loop, nor where that patch stepped aside).
    """
    from verl.utils import tensordict_utils as tu

    values = _per_sample(tu.get(micro_batch, key), count)
    if all(value is not None for value in values):
        return values
    extras = _per_sample(tu.get(micro_batch, "extra_fields"), count)
    return [
        extra.get(key) if value is None and isinstance(extra, dict) else value
        for value, extra in zip(values, extras, strict=True)
    ]


def describe_samples(micro_batch: Any) -> list[SampleInfo]:
    """One :class:`SampleInfo` per sample of a verl micro-batch (jagged ``input_ids``)."""
    from verl.utils import tensordict_utils as tu

    sequences = micro_batch["input_ids"].unbind()
    count = len(sequences)
    lengths = prompt_lengths(micro_batch)
    uids = _per_sample(tu.get(micro_batch, "uid"), count)
    sessions = _per_sample(tu.get(micro_batch, "session_id"), count)
    firsts = _sample_field(micro_batch, REQUEST_ID, count)
    every = _sample_field(micro_batch, ALL_REQUEST_IDS, count)
    return [
        SampleInfo(
            index=i,
            uid=None if uids[i] is None else str(uids[i]),
            session_id=sessions[i],
            request_id=None if firsts[i] is None else str(firsts[i]),
            request_ids=_request_ids(every[i] if every[i] is not None else firsts[i]),
            prompt_len=lengths[i],
            prompt_hash=join_keys.prompt_hash(sequences[i][: lengths[i]].tolist()),
            seq_len=int(sequences[i].shape[-1]),
        )
        for i in range(count)
    ]


def global_step_of(micro_batch: Any) -> Any:
    """The trainer's global step: NonTensorData in v0, a per-sample field in v1."""
    from verl.utils import tensordict_utils as tu

    return _first(tu.get(micro_batch, "global_steps"))


def _one_row(piece: Any, like: Any) -> Any:
    """A jagged tensor holding one row, ragged along its last dimension as ``like`` is."""
    import torch
    from verl.utils import tensordict_utils as tu

    build = getattr(tu, "nested_tensor_from_tensor_list", None)  # verl >= 0.8
    if build is not None:
        return build([piece], ragged_idx=getattr(like, "_ragged_idx", piece.dim()))
    nested = torch.nested.as_nested_tensor([piece], layout=torch.jagged)
    if piece.dim() > 1:  # as verl 0.7 marks 3-D position ids (maybe_fix_3d_position_ids)
        nested._ragged_idx = piece.dim()
    return nested


def prompt_only_micro_batch(micro_batch: Any, index: int, prompt_len: int) -> Any:
    """Sample ``index`` of ``micro_batch`` as a one-sample micro-batch holding only its prompt.

    Every per-sample field comes along (temperature, multi-modal inputs, flags); ``input_ids``
    and ``position_ids`` are cut to the prompt (the last dimension, so 3-D mRoPE ids too).
    ``loss_mask`` becomes zeros over the prompt: no token of it is a training target, and it is
    as long as ``input_ids``, which every reader accepts (Megatron's MTP loss-mask builders; the
    FSDP engine's padded path in verl 0.7.1/0.8, which takes its attention mask from it). The
    flags asking for extra outputs are turned off, and Megatron's padding to the mini-batch's
    longest sequence (``forced_max_seqlen``, verl 0.9) is dropped: only the prompt's own forward
    is wanted.
    """
    import torch
    from verl.utils import tensordict_utils as tu

    one = tu.index_select_tensor_dict(micro_batch, [index])
    for key in ("input_ids", "position_ids"):
        full = micro_batch[key]
        one[key] = _one_row(full.unbind()[index][..., :prompt_len], full)
    loss_mask = micro_batch.get("loss_mask", None)
    if loss_mask is not None:
        zeros = torch.zeros(prompt_len, dtype=loss_mask.dtype, device=loss_mask.device)
        one["loss_mask"] = _one_row(zeros, micro_batch["input_ids"])
    tu.assign_non_tensor(
        one, calculate_entropy=False, calculate_sum_pi_squared=False, distillation_use_topk=False, compute_loss=False
    )
    if tu.get(one, "forced_max_seqlen") is not None:
        tu.assign_non_tensor(one, forced_max_seqlen=None)
    return one


class ActorDumper:
    """The process's training-side dump state: its debugger, its log, the pass and window in progress."""

    def __init__(self) -> None:
        self.current: Pass | None = None
        self._window: StepWindow | None = None
        self._debugger: Any = None
        self._log: JsonlLog | None = None
        self._unreached: set[type] = set()  # engine classes already reported as never dumped

    # --- configuration -------------------------------------------------------------------------

    def debugger(self) -> Any:
        """The process's msprobe debugger for the actor config; raises DebuggerUnavailable."""
        if self._debugger is None:
            cfg = bootstrap.current_config()
            if cfg is None:
                raise debugger_module.DebuggerUnavailable("msprobe-hooks is not active in this process")
            path = cfg.actor_config or debugger_module.DEFAULT_ACTOR_CONFIG
            settings = config_module.read_msprobe_config("MSPROBE_ACTOR_CONFIG", path)
            root = settings.get("dump_path") or cfg.actor_dump_root
            self._debugger = debugger_module.get_debugger(path, root)
            self._log = JsonlLog(root, LOG_FILENAME)
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
            "deciding whether the pass is dumped", self._decide, engine, method_args, kwargs, dumpable, refuse
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
        engine: Any,
        args: tuple,
        kwargs: dict,
        dumpable: Callable[[Any], bool],
        refuse: Callable[[Any, str, Any], None] | None,
    ) -> tuple[str, bool]:
        """The pass's phase and whether it is due."""
        forward_only = patching.argument(args, kwargs, "forward_only", 2, False)
        phase = config_module.LOG_PROB if forward_only else config_module.UPDATE_ACTOR
        cfg = bootstrap.current_config()
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
        debugger = self.debugger()
        self.close()
        step = debugger_module.next_step(debugger)
        debugger.start(model=model)
        fields = {"phase": current.phase, "micro_batch": current.micro_batch, "dump": dump}
        recording = debugger_module.is_recording()
        self._window = StepWindow(step, recording, current.patch, fields, micro_batch=micro_batch, **known)

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

    def _close(self, window: StepWindow, write: bool) -> None:
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

    def _write(self, window: StepWindow, debugger: Any) -> None:
        samples, global_step = window.samples, window.global_step
        if window.micro_batch is not None:
            samples, global_step = self.describe(window.micro_batch, window.patch)
        samples = [s for s in samples if not s.padding]
        request_ids = [sample.request_id for sample in samples if sample.request_id is not None]
        record = {
            "source": LOG_SOURCE,
            "timestamp": join_keys.timestamp(),
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
            what = f"the {LOG_FILENAME} line of step {window.step}"
            storage.report_loss(what, exc, self._log.path, patching.strict())

    # --- the two kinds of micro-batch dump -----------------------------------------------------

    def describe(self, micro_batch: Any, patch: patching.PatchContext) -> tuple[list[SampleInfo], Any]:
        """The samples and global step of a micro-batch for its log line; ([], None) if unreadable
        (a layout we do not know: the dump stands, its line lacks the samples)."""
        return patch.guarded("reading the samples of a micro-batch", _samples_and_step, micro_batch, default=([], None))

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
        debugger = self.debugger()
        finished = debugger_module.has_finished(debugger)
        batches = current.patch.guarded("cutting the prompts", _prompt_batches, micro_batch, samples)
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


def _samples_and_step(micro_batch: Any) -> tuple[list[SampleInfo], Any]:
    return describe_samples(micro_batch), global_step_of(micro_batch)


def _prompt_batches(micro_batch: Any, samples: list[SampleInfo]) -> list[Any]:
    return [prompt_only_micro_batch(micro_batch, sample.index, sample.prompt_len) for sample in samples]


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
