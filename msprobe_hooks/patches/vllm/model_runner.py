"""vLLM's V1 model runner: the dispatch log (GPU vLLM and vLLM-Ascend), msprobe dumps on GPU vLLM.

Patch ``vllm.model_runner`` wraps ``vllm.v1.worker.gpu_model_runner.GPUModelRunner``, which
vLLM-Ascend's ``NPUModelRunner`` inherits:

* ``__init__`` (after): the runner's :class:`RunnerDump`. With ``MSPROBE_GENERATE_CONFIG`` set
  on GPU vLLM, this patch drives msprobe itself, as vLLM-Ascend does natively, provided the
  engine is eager (else it refuses, one error line) and the runner class runs vLLM's own
  ``execute_model``. It also puts back any of these wrappers that something replaced since
  import: vLLM-Ascend 0.13 swaps ``GPUModelRunner._update_states`` while it starts up.
* ``_update_states`` (after): the persistent batch is final here (condensed and reordered), so
  ``input_batch.req_ids`` is the order of the packed tokens. One :class:`ScheduledRequest` per
  row; then, when driving msprobe, ``start()`` with the scheduled tokens in that order.
* ``execute_model`` / ``sample_tokens``, wrapped only with ``MSPROBE_GENERATE_CONFIG``: when driving
  msprobe, ``stop()`` and ``step()`` once the step is over (``execute_model`` returned output,
  raised, or ``sample_tokens`` returned).

A line is written once the step's requests and its msprobe ``start()`` are both known
(:class:`RunnerDump`), so ``step`` is the folder msprobe dumps that forward into. The vLLM-Ascend
patch (:mod:`.ascend_model_runner`) reports the native debugger's ``start()``/``step()``
into the same state.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

from msprobe_hooks.bootstrap import current_config
from msprobe_hooks.config import Config, read_msprobe_config
from msprobe_hooks.contracts import module_version
from msprobe_hooks.debugger import DebuggerUnavailable, get_debugger, is_recording
from msprobe_hooks.inference.dispatch_log import (
    PromptHashes,
    ScheduledRequest,
    StepCounter,
    StepWindow,
    current_rank,
    distributed_ready,
    make_scheduled_request,
    open_log,
    step_line,
)
from msprobe_hooks.join_keys import strip_vllm_suffix
from msprobe_hooks.log import logger
from msprobe_hooks.patching import PatchContext, Refusal, TargetChanged, argument

EAGER_HINT = "enforce_eager=True (--enforce-eager; verl: actor_rollout_ref.rollout.enforce_eager=True)"

_states: weakref.WeakKeyDictionary[Any, RunnerDump] = weakref.WeakKeyDictionary()
_runner_class: Any = None  # the GPUModelRunner class patched
_ctx: PatchContext | None = None  # the context it was patched with


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


class EngineNotEager(Refusal):
    """MSPROBE_GENERATE_CONFIG with a compiled or graph-captured engine (raised under MSPROBE_HOOKS_STRICT=1)."""


class RunnerDump:
    """What one model runner dumps and logs: its dispatch log, step numbering, the debugger followed
    (SGLang's counterpart: ``patches.sglang.model_runner.RunnerDump``)."""

    def __init__(self, runner: Any, cfg: Config) -> None:
        ascend = type(runner).__module__.split(".")[0] == "vllm_ascend"
        self.engine = "vllm-ascend" if ascend else "vllm"
        self.engine_version = module_version("vllm_ascend" if ascend else "vllm")
        self.strips_suffix = randomizes_request_ids(module_version("vllm"))
        self.prompts = PromptHashes()
        self.known: dict[str, tuple[str, str | None]] = {}  # request id -> (the id the client sent, prompt hash)
        self.counter = StepCounter()
        self.dump_root = cfg.generate_dump_root
        self.log = open_log(self.dump_root)
        self.debugger: Any = None  # the msprobe debugger whose steps the lines follow
        self.drive_config: str | None = None  # set when this patch creates and drives msprobe (GPU vLLM)
        self.in_step = False  # a start() of ours awaits its stop()/step()
        self.window: StepWindow | None = None
        self.depth = 0  # _update_states re-entered (a replacement that calls our wrapper)
        self.rank: int | None = None  # once torch.distributed is up: asking it costs more than a row

    # --- following a debugger ------------------------------------------------------------------

    def follow(self, debugger: Any, dump_root: str) -> None:
        """Number lines by ``debugger``'s steps; the log goes next to its dumps."""
        self.debugger = debugger
        self.dump_root = dump_root
        self.log = open_log(dump_root)

    def on_batch(self, requests: list[ScheduledRequest]) -> None:
        """The requests of a model step, in packed order (after ``_update_states``)."""
        if self.debugger is None:  # no msprobe: nothing to wait for
            self._write(self.counter.take(), False, requests)
            return
        window = self.window
        if window is not None and window.started:
            # start() came first (vLLM-Ascend 0.20-0.23 starts before _update_states), or a
            # second forward runs inside one msprobe step: either way, that step's folder.
            window.requests = requests
            self._write(window.step, window.dumped, requests)
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
        if window.requests is not None:
            self._write(window.step, window.dumped, window.requests)

    def on_stepped(self) -> None:
        """The followed debugger's ``step()`` returned: its step is over."""
        window, self.window = self.window, None
        if window is not None and not window.started and window.requests is not None:
            self._write_unstarted(window)

    def _write_unstarted(self, window: StepWindow) -> None:
        # A model step no start() covered (an early return between _update_states and start()).
        self._write(self.counter.take(), False, window.requests or [])

    def identify(self, runner: Any, request_id: str) -> tuple[str, str | None]:
        """(the id the client sent, the prompt hash) of a request the runner holds."""
        base = strip_vllm_suffix(request_id) if self.strips_suffix else request_id
        cached = runner.requests.get(request_id)
        return base, self.prompts.get(request_id, getattr(cached, "prompt_token_ids", None))

    def _write(self, step: int, dumped: bool, requests: list[ScheduledRequest]) -> None:
        rank = self.rank
        if rank is None:
            rank = current_rank()
            if distributed_ready():  # a worker's rank does not change once its group exists
                self.rank = rank
        line = step_line(
            engine=self.engine,
            engine_version=self.engine_version,
            rank=rank,
            step=step,
            dumped=dumped,
            requests=requests,
        )
        self.log.write_line(line)

    # --- driving msprobe (GPU vLLM) ------------------------------------------------------------

    def create_debugger(self) -> None:
        assert self.drive_config is not None
        dump_path = os.path.join(self.dump_root, str(os.getpid()))
        try:
            self.debugger = get_debugger(self.drive_config, dump_path)
        except DebuggerUnavailable as exc:
            logger().error("no msprobe dumps in this vLLM worker: %s", exc)
            self.drive_config = None

    def start(self, runner: Any, requests: list[ScheduledRequest]) -> None:
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

    def finish(self) -> None:
        if not self.in_step:
            return
        self.in_step = False
        try:
            self.debugger.stop()
            self.debugger.step()
        finally:
            self.on_stepped()  # the window closes even if msprobe failed


def state_of(runner: Any) -> RunnerDump | None:
    return _states.get(runner)


# --- Reading the batch ------------------------------------------------------------------------


def scheduled_requests(runner: Any, scheduler_output: Any, state: RunnerDump) -> list[ScheduledRequest]:
    """The step's requests in packed order: ``input_batch`` rows as ``_update_states`` left them."""
    batch = runner.input_batch
    request_ids = batch.req_ids
    rows = len(request_ids)
    computed = batch.num_computed_tokens_cpu[:rows].tolist()  # one conversion, not one per row
    prompt_lens = batch.num_prompt_tokens[:rows].tolist()
    new_ids = {new.req_id for new in scheduler_output.scheduled_new_reqs}
    tokens = scheduler_output.num_scheduled_tokens
    known = state.known
    requests = []
    for request_id, done, prompt_len in zip(request_ids, computed, prompt_lens, strict=True):
        scheduled = tokens.get(request_id)
        if not scheduled:
            continue
        new = request_id in new_ids
        identity = known.get(request_id)
        if identity is None or new:  # a running request keeps its id and prompt: looked up once
            identity = known[request_id] = state.identify(runner, request_id)
        base, prompt_hash = identity
        requests.append(
            make_scheduled_request((request_id, base, new, scheduled, done, prompt_len, prompt_hash, False))
        )
    if len(known) > 2 * len(runner.requests) + 64:  # finished requests piled up
        state.known = {k: v for k, v in known.items() if k in runner.requests}
    state.prompts.retain(runner.requests)
    return requests


def not_eager(runner: Any) -> str | None:
    """Why msprobe's hooks would not run in this engine's forward, or None when it is eager."""
    compilation = runner.compilation_config
    mode = getattr(compilation, "mode", None)  # CompilationMode (0.11.1+)
    if mode is None:
        mode = getattr(compilation, "level", None)  # 0.11.0: CompilationLevel int
    graphs = compilation.cudagraph_mode
    reasons = []
    if mode is not None and int(mode) != 0:
        reasons.append(f"compilation mode {getattr(mode, 'name', mode)}")
    if graphs is not None and graphs.name != "NONE":
        reasons.append(f"cudagraph_mode {graphs.name}")
    return ", ".join(reasons) or None


# --- The wrappers -------------------------------------------------------------------------------


def _owner(cls: type, name: str) -> type | None:
    return next((klass for klass in cls.__mro__ if name in vars(klass)), None)


def _set_up(runner: Any, base: type) -> None:
    cfg = current_config()
    if cfg is None:
        return
    state = _states[runner] = RunnerDump(runner, cfg)
    if not cfg.generate_config or state.engine != "vllm":
        return  # vLLM-Ascend: its own switch, followed by the vllm_ascend.model_runner patch
    dump_path = read_msprobe_config("MSPROBE_GENERATE_CONFIG", cfg.generate_config).get("dump_path")
    state.dump_root = dump_path or cfg.generate_dump_root
    state.log = open_log(state.dump_root)
    own_steps = [n for n in ("execute_model", "sample_tokens") if _owner(type(runner), n) not in (None, base)]
    if own_steps:
        logger().warning(
            "%s runs its own %s, so msprobe-hooks cannot bracket its steps: MSPROBE_GENERATE_CONFIG gives no "
            "dumps in this worker (the dispatch log is still written)",
            type(runner).__qualname__,
            " and ".join(own_steps),
        )
        return
    reason = not_eager(runner)
    if reason:
        message = (
            f"MSPROBE_GENERATE_CONFIG is set but this vLLM engine is not eager ({reason}): msprobe's hooks "
            f"do not run inside CUDA graphs or compiled code, so this worker dumps nothing. Start vLLM with "
            f"{EAGER_HINT}. The dispatch log is still written."
        )
        logger().error("%s", message)
        if cfg.strict:
            raise EngineNotEager(message)
        return
    state.drive_config = cfg.generate_config


def _init(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    # EngineNotEager (MSPROBE_HOOKS_STRICT=1) is a Refusal: it passes the guard and stops the engine.
    _ctx.guarded("setting up the runner's dispatch log and dumps", _set_up_runner, instance)
    return result


def _set_up_runner(runner: Any) -> None:
    replaced = _install(_runner_class)
    if replaced:
        logger().info("re-applied %s to %s, replaced since import", _ctx.name, ", ".join(replaced))
    _set_up(runner, _runner_class)


def _update_states(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    state = _states.get(instance)
    if state is None or state.depth:
        return wrapped(*args, **kwargs)
    state.depth += 1
    try:
        result = wrapped(*args, **kwargs)
    finally:
        state.depth -= 1
    _ctx.guarded("recording the step's requests", _record_step, instance, state, args, kwargs)
    return result


def _record_step(runner: Any, state: RunnerDump, args: tuple, kwargs: dict) -> None:
    scheduler_output = argument(args, kwargs, "scheduler_output", 0)
    if not scheduler_output.total_num_scheduled_tokens:
        return
    if state.drive_config is not None and state.debugger is None:
        state.create_debugger()
    requests = scheduled_requests(runner, scheduler_output, state)
    state.on_batch(requests)
    if state.drive_config is not None:
        state.start(runner, requests)


def _execute_model(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    state = _states.get(instance)
    if state is None or state.drive_config is None:
        return wrapped(*args, **kwargs)
    try:
        result = wrapped(*args, **kwargs)
    except BaseException:
        _ctx.guarded("ending the step's dump", state.finish)
        raise
    if result is not None:  # output now (0.11.0, pooling, PP), else sample_tokens() ends the step
        _ctx.guarded("ending the step's dump", state.finish)
    return result


def _sample_tokens(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    state = _states.get(instance)
    if state is None or state.drive_config is None:
        return wrapped(*args, **kwargs)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _ctx.guarded("ending the step's dump", state.finish)


WRAPPERS: dict[str, Callable[..., Any]] = {
    "__init__": _init,
    "_update_states": _update_states,
    "execute_model": _execute_model,
    "sample_tokens": _sample_tokens,  # 0.11.1+
}


# What only a dump needs: without MSPROBE_GENERATE_CONFIG these wrappers would do nothing at every step.
DUMP_WRAPPERS = frozenset({"execute_model", "sample_tokens"})


def _install(cls: type) -> list[str]:
    """Wrap every method (that this configuration needs) not, or no longer, wrapped; the names newly wrapped."""
    dumps = _ctx.config is not None and bool(_ctx.config.generate_config)
    wrapped = []
    for name, wrapper in WRAPPERS.items():
        if name not in vars(cls) or (name in DUMP_WRAPPERS and not dumps):
            continue
        if not _ctx.is_wrapped(cls, name):
            _ctx.wrap(cls, name, wrapper)
            wrapped.append(f"{cls.__qualname__}.{name}")
    return wrapped


def is_applied(module: Any) -> bool:
    return _ctx is not None and _ctx.active and _ctx.is_wrapped(module.GPUModelRunner, "__init__")


def patch(module: Any, ctx: PatchContext) -> None:
    global _runner_class, _ctx
    if ctx.config is None:
        raise TargetChanged("msprobe-hooks is not active in this process")
    _runner_class, _ctx = module.GPUModelRunner, ctx
    _install(module.GPUModelRunner)
