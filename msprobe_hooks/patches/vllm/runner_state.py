"""The state of one vLLM model runner: the requests of each model step, its msprobe step numbers, the
debugger followed (vLLM-Ascend's own) or driven (GPU vLLM with ``MSPROBE_GENERATE_CONFIG``).

The wrappers of :mod:`.model_runner` and the vLLM-Ascend patch (:mod:`.ascend_model_runner`) report into
it: a line is written once a step's requests and its msprobe ``start()`` are both known, so ``step`` is
the folder msprobe dumps that forward into.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from msprobe_hooks.config import Config
from msprobe_hooks.contracts import module_version
from msprobe_hooks.debugger import DebuggerUnavailable, get_debugger, is_recording, step_folder
from msprobe_hooks.inference import routed_experts
from msprobe_hooks.inference.dispatch_log import (
    DeferredRows,
    PromptHashes,
    RunnerLog,
    ScheduledRequest,
    StepCounter,
    StepWindow,
    open_log,
)
from msprobe_hooks.inference.evidence import EvidenceLogs
from msprobe_hooks.inference.kept_logits import LogitsKeeper, keeper_for
from msprobe_hooks.inference.routed_experts import RoutingRecorder
from msprobe_hooks.join_keys import strip_vllm_suffix
from msprobe_hooks.log import logger

_states: weakref.WeakKeyDictionary[Any, VllmRunner] = weakref.WeakKeyDictionary()


def randomizes_request_ids(vllm_version: str | None, environ: Any = os.environ) -> bool:
    """Whether vLLM turns request ids into ``{id}-{8 hex}``: from 0.14, unless opted out (0.17+).

    An unknown version follows the opt-out too: a user who set it gets the ids the client sent.
    """
    from packaging.version import InvalidVersion, Version

    try:
        opted_out = bool(int(environ.get("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", "0")))  # vLLM's own parsing
    except ValueError:
        opted_out = False
    try:
        version = Version(vllm_version or "")
    except InvalidVersion:
        return not opted_out  # else stripping a suffix vLLM did not add is the lesser harm
    if version < Version("0.14.0.dev0"):
        return False
    return version < Version("0.17.0.dev0") or not opted_out


class VllmRunner(RunnerLog):
    """What one vLLM model runner dumps and logs: its step numbering, the requests of each step, the debugger
    followed or driven (SGLang's counterpart: ``patches.sglang.model_runner.SglangRunner``)."""

    def __init__(self, runner: Any, cfg: Config) -> None:
        ascend = type(runner).__module__.split(".")[0] == "vllm_ascend"
        engine = "vllm-ascend" if ascend else "vllm"
        super().__init__(engine, module_version("vllm_ascend" if ascend else "vllm"), open_log(cfg.generate_dump_root))
        self.strips_suffix = randomizes_request_ids(module_version("vllm"))
        self.prompts = PromptHashes()
        self.known: dict[str, tuple[str, str | None]] = {}  # request id -> (the id the client sent, prompt hash)
        # The last step's request ids (in batch order), with their bases, prompt lengths and hashes, when none was new
        self.last_batch: tuple[list[str], Sequence[str], list[int], Sequence[str | None]] | None = None
        # The last step's rows when it brought new requests, until made: the next step reads what they find
        self.last_new: DeferredRows | None = None
        self.counter = StepCounter()
        self.dump_root = cfg.generate_dump_root
        self.debugger: Any = None  # the msprobe debugger whose steps the lines follow
        self.drive_config: str | None = None  # set when this patch creates and drives msprobe (GPU vLLM)
        self.in_step = False  # a start() of ours awaits its stop()/step()
        self.window: StepWindow | None = None
        self.depth = 0  # _update_states re-entered (a replacement that calls our wrapper)
        self.routing: RoutingRecorder | None = None  # the routers' choices of each dumped step (or every step)
        self.routing_bound = False  # the routers were looked for (once the model is loaded)
        self.evidence: EvidenceLogs | None = None  # engine.jsonl and requests.jsonl, beside the dispatch log
        self.described: tuple[Any, Any] | None = None  # (model, model_config) of the last engine.jsonl line
        self.logits: LogitsKeeper | None = None  # the logits of dumped steps, where msprobe leaves them out
        self.logits_bound = False  # the logits processor was looked at (after msprobe's first start())
        self.finished: int | None = None  # the step finish() ended, when msprobe dumped it

    # --- the evidence beside the dispatch log (engine.jsonl, requests.jsonl) ---------------------

    def describes(self, runner: Any) -> bool:
        """Whether the last ``engine.jsonl`` line describes the runner's model as loaded now (identity only: two
        attribute reads a step; a reload or ``update_config`` replaces the objects)."""
        described = self.described
        return (
            described is not None
            and getattr(runner, "model", None) is described[0]
            and runner.model_config is described[1]
        )

    def evidence_logs(self) -> EvidenceLogs:
        """The files :mod:`.evidence` writes, under the dispatch log's root."""
        if self.evidence is None or self.evidence.root != self.dump_root:  # beside the dispatch log, wherever it went
            self.evidence = EvidenceLogs(self.dump_root)
        return self.evidence

    # --- the routers' choices (a driven dump, or MSPROBE_HOOKS_ROUTING) -------------------------

    def bind_routing(self, model: Any, guarded: Callable[..., Any], asked: bool) -> None:
        """Feed every MoE router's capture hook of ``model`` into this runner's recorder (once); ``asked``: by
        ``MSPROBE_HOOKS_ROUTING`` (a model without routers then says so), not only by a dump driven."""
        self.routing_bound = True
        self.routing = routed_experts.recorder_for(
            self.dump_root, model, asked, lambda found, recorder: routed_experts.bind(found, recorder, guarded)
        )

    def end_routing(self) -> None:
        """The step is over: write what its routers chose (dumped steps only when a debugger runs)."""
        if self.routing is None:
            return
        if self.last_line is None:
            self.routing.discard()
            return
        step, dumped, requests = self.last_line
        if self.debugger is not None and not dumped:
            self.routing.discard()
            return
        self.routing.flush(step, self.rank, dumped, requests)

    # --- following a debugger ------------------------------------------------------------------

    def follow(self, debugger: Any, dump_root: str) -> None:
        """Number lines by ``debugger``'s steps; the log goes next to its dumps."""
        self.debugger = debugger
        self.dump_root = dump_root
        self.log = open_log(dump_root)

    def on_batch(self, requests: Sequence[ScheduledRequest]) -> None:
        """The requests of a model step, in packed order (after ``_update_states``)."""
        if self.debugger is None:  # no msprobe: nothing to wait for
            self.write(self.counter.take(), False, requests)
            return
        window = self.window
        if window is not None and window.started:
            # start() came first (vLLM-Ascend 0.20-0.23 starts before _update_states), or a
            # second forward runs inside one msprobe step: either way, that step's folder.
            window.requests = requests
            self.write(window.step, window.dumped, requests)
            return
        if window is not None and window.requests is not None:
            self._write_unstarted(window)
        self.window = StepWindow()
        self.window.requests = requests

    def on_started(self) -> None:
        """The followed debugger's ``start()`` returned."""
        window = self.window
        if window is None or window.started:
            window = self.window = StepWindow()
        window.started = True
        window.step = self.counter.take(self.debugger)
        window.dumped = is_recording()
        if self.routing is not None:  # the routers' ids of a step msprobe does not dump are not even copied
            self.routing.armed = window.dumped
        if window.requests is not None:
            self.write(window.step, window.dumped, window.requests)

    def on_stepped(self) -> None:
        """The followed debugger's ``step()`` returned: its step is over."""
        window, self.window = self.window, None
        if window is not None and not window.started and window.requests is not None:
            self._write_unstarted(window)

    def _write_unstarted(self, window: StepWindow) -> None:
        # A model step no start() covered (an early return between _update_states and start()).
        self.write(self.counter.take(), False, window.requests or [])

    def client_id(self, request_id: str) -> str:
        """The id the client sent, from the engine's."""
        return strip_vllm_suffix(request_id) if self.strips_suffix else request_id

    # --- driving msprobe (GPU vLLM) ------------------------------------------------------------

    def create_debugger(self) -> None:
        assert self.drive_config is not None
        dump_path = os.path.join(self.dump_root, str(os.getpid()))
        try:
            self.debugger = get_debugger(self.drive_config, dump_path)
        except DebuggerUnavailable as exc:
            logger().error("no msprobe dumps in this vLLM worker: %s", exc)
            self.drive_config = None

    def start(self, runner: Any, requests: Sequence[ScheduledRequest]) -> None:
        if self.in_step:  # the last step never reached sample_tokens()
            self.finish()
        # Packed order, so that msprobe's request_id slicing cuts the right rows; keyed by the id
        # the client sent when those are unique, so a config can name it despite vLLM's suffix.
        bases = {r.request_id_base for r in requests}
        by_base = len(bases) == len(requests)
        scheduled = {(r.request_id_base if by_base else r.request_id): r.tokens for r in requests}
        self.debugger.start(model=runner.get_model(), scheduled_tokens=scheduled)
        self.in_step = True
        self.on_started()
        if not self.logits_bound:  # msprobe has hooked the model now: what it left out is known
            self.logits_bound = True
            self.logits = keeper_for(runner.get_model(), self.debugger)
        if self.logits is not None and self.window is not None:
            self.logits.armed = self.window.dumped

    def finish(self) -> None:
        if not self.in_step:
            return
        self.in_step = False
        window = self.window
        self.finished = window.step if window is not None and window.dumped else None
        try:
            self.debugger.stop()
            self.debugger.step()
        finally:
            self.on_stepped()  # the window closes even if msprobe failed

    def end_logits(self) -> None:
        """The step is over: the logits kept of it beside msprobe's dump of it (a step it dumped)."""
        if self.logits is not None:
            step, self.finished = self.finished, None
            self.logits.write(step_folder(self.debugger, step) if step is not None else None)


def state_of(runner: Any) -> VllmRunner | None:
    return _states.get(runner)


def set_state(runner: Any, state: VllmRunner) -> None:
    _states[runner] = state
