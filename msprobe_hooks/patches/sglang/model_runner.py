"""SGLang ``ModelRunner``: msprobe dumps where SGLang has no switch for them, a dispatch log everywhere.

``__init__`` decides, per runner, who dumps:

* SGLang < 0.5.11 with ``MSPROBE_GENERATE_CONFIG``: we do. The runner gets the process's debugger
  (``msprobe_hooks.debugger``), as the msprobe recipe's source patch did, and ``forward`` brackets
  the selected forwards (``MSPROBE_HOOKS_GENERATE_FORWARDS``) with ``start(model, rank_id)`` /
  ``stop()``, and calls ``step()`` after every forward, so that ``step{N}`` is the N-th forward of
  the process, as with SGLang's native switch.
* SGLang >= 0.5.11 with ``--msprobe-dump-config``: SGLang does (its own debugger, its own
  start/stop/step in ``forward``). We never make a second debugger; we only move its output under
  ``{dump_path}/{pid}/``, so that engines and scheduler processes never share a folder.
* otherwise nobody dumps and only the dispatch log is written.

A dump with CUDA graphs on misses everything that runs inside a graph, silently, so ``__init__``
refuses it before the model loads, naming the flag that fixes it. The dispatch log itself works in
every mode.

``forward`` writes one line per call to ``{generate dump_path}/{pid}/dispatch_log.jsonl``: which
requests the forward holds, in token order, how many tokens each, how many were already cached,
and the msprobe step the forward is.

Beside it, as vLLM's runners do (:mod:`.evidence`): ``engine.jsonl``, one line per runner once ``__init__`` has
loaded the model, and ``requests.jsonl``, one line per request in the first forward that holds it; and, for an MoE
model whenever a debugger runs (or with ``MSPROBE_HOOKS_ROUTING=1``), ``routed_experts.jsonl``: what each ``TopK``
module chose in every dumped forward (:mod:`msprobe_hooks.inference.routed_experts`).
"""

from __future__ import annotations

import inspect
import logging
import os
from types import ModuleType
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from msprobe_hooks import config as config_module
from msprobe_hooks import debugger, patching
from msprobe_hooks.inference import dispatch_log, routed_experts
from msprobe_hooks.inference.dispatch_log import (
    RunnerLog,
    ScheduledRequest,
    StepCounter,
    StepWindow,
    make_scheduled_request,
)
from msprobe_hooks.inference.evidence import EvidenceLogs
from msprobe_hooks.jsonl import JsonlLog
from msprobe_hooks.patches import sglang as records
from msprobe_hooks.patches.sglang import evidence
from msprobe_hooks.patches.sglang.forward_batch import NEW_REQUESTS_ATTR, REQUESTS_ATTR, RequestIdentity
from msprobe_hooks.patching import PatchContext, argument

NATIVE_FROM = Version(records.NATIVE_FROM)
_STATE_ATTR = "_msprobe_hooks_runner"

log = logging.getLogger("msprobe_hooks")

_NATIVE_GRAPH_CHECK = SpecifierSet(records.NATIVE_GRAPH_CHECK)


class GraphModeRefused(RuntimeError):
    """A dump was asked for while CUDA graphs are on; msprobe would record nothing inside them."""


def release(ctx: PatchContext) -> Version:
    """The installed SGLang's version, as the version gate read it (the SGLang patches depend on it)."""
    if ctx.version is None:
        raise patching.TargetChanged("cannot tell which SGLang version is installed")
    return Version(ctx.version)


# --- what a ForwardBatch holds --------------------------------------------------------------------


def _identities(forward_batch: Any, count: int) -> list[RequestIdentity | str | None]:
    """Per row: the identity the forward-batch patch attached, else the bare id (0.5.10+), else None."""
    attached = getattr(forward_batch, REQUESTS_ATTR, None)
    if attached is not None and len(attached) == count:
        return list(attached)
    rids = getattr(forward_batch, "rids", None)
    if rids is not None and len(rids) == count:
        return [str(rid) for rid in rids]
    return [None] * count


def batch_requests(forward_batch: Any) -> tuple[str, list[ScheduledRequest]]:
    """(forward mode name, request rows in token order) of one ForwardBatch."""
    mode = forward_batch.forward_mode
    mode_name = getattr(mode, "name", str(mode))
    extend_lens = forward_batch.extend_seq_lens_cpu
    if extend_lens is not None:  # extend-like modes: each row's new tokens follow its cached prefix
        tokens = [int(n) for n in extend_lens]
        computed: list[int | None] = [int(n) for n in forward_batch.extend_prefix_lens_cpu]
    else:  # decode / idle: one token per request, after seq_len - 1 cached ones
        seq_lens = forward_batch.seq_lens_cpu
        tokens = [1] * int(forward_batch.batch_size)
        computed = [n - 1 for n in seq_lens.tolist()] if seq_lens is not None else [None] * len(tokens)
    rows = []
    for ident, n, done in zip(_identities(forward_batch, len(tokens)), tokens, computed, strict=True):
        if isinstance(ident, RequestIdentity):
            request_id, prompt_len, prompt_hash, new = ident
            rows.append(make_scheduled_request((request_id, request_id, new, n, done, prompt_len, prompt_hash, False)))
        else:  # no prompt known: classify by mode (a MIXED batch's decode rows hold one token)
            prefill = mode_name in ("EXTEND", "SPLIT_PREFILL") or (mode_name == "MIXED" and n > 1)
            # SGLang keeps the client's id as is: the base id is the id.
            rows.append(ScheduledRequest(ident, ident, prefill and done == 0, n, done, None, None, prefill))
    return mode_name, rows


# Steps are shared by every runner of the process: target and draft models share one debugger.
_steps = StepCounter()


# --- per runner ------------------------------------------------------------------------------------

_logs: dict[str, JsonlLog] = {}
_redirected: set[int] = set()  # ids of native debuggers already sent to {dump_path}/{pid}
_warned_unused_config = False


class SglangRunner(RunnerLog):
    """What one ModelRunner dumps and logs, decided once in ``__init__`` (vLLM's counterpart:
    ``patches.vllm.runner_state.VllmRunner``)."""

    def __init__(
        self,
        debugger: Any | None,
        own: bool,
        dump_all: bool,
        rank_id: int | None,
        engine_version: str,
        log: JsonlLog,
    ) -> None:
        super().__init__("sglang", engine_version, log)
        self.evidence = EvidenceLogs(log.root)  # engine.jsonl and requests.jsonl, beside the dispatch log
        self.debugger = debugger
        self.own = own  # we start/stop/step the debugger; otherwise SGLang does, or nobody
        self.dump_all = dump_all  # own debugger only: every forward, not just those holding prompt tokens
        self.rank_id = rank_id  # passed to start() (DP > 1), as SGLang's native switch does
        self.routing: routed_experts.RoutingRecorder | None = None  # the TopK modules' choices (an MoE model)

    def bind_routing(self, model: Any, asked: bool) -> None:
        """Keep what every TopK module of the loaded ``model`` chooses (``asked``: by ``MSPROBE_HOOKS_ROUTING``)."""
        self.routing = routed_experts.recorder_for(self.log.root, model, asked, routed_experts.bind_topk_modules)

    def begin(self, model: Any, forward_batch: Any) -> StepWindow:
        """Before the forward: its rows and step; start our debugger when this forward is to be dumped."""
        mode, rows = batch_requests(forward_batch)
        self.evidence.write_requests(getattr(forward_batch, NEW_REQUESTS_ATTR, ()))
        if self.routing is not None:
            self.routing.discard()  # calls of forwards no line of ours covers (a warm-up run of the model itself)
        window = StepWindow(_steps.take(self.debugger), requests=rows, forward_mode=mode)
        if self.own and self.debugger is not None and (self.dump_all or dispatch_log.phase(rows) == "prefill"):
            # The runner's current model: a weight reload from disk replaces the object.
            self.debugger.start(model=model, rank_id=self.rank_id)
            window.started = True
        return window

    def end(self, window: StepWindow) -> None:
        """After the forward (also one that raised): stop and step our debugger, write the line."""
        dumped = False
        if self.debugger is not None:
            if self.own:
                if window.started:
                    self.debugger.stop()
                self.debugger.step()
            dumped = debugger.step_dumped(self.debugger, window.step)
        rank = self.rank_id
        if rank is None and self.debugger is not None:
            rank = debugger.dump_rank(self.debugger)
        self.write(window.step, dumped, window.requests or [], window.forward_mode, rank)
        if self.routing is not None:  # a dumped forward's choices, or every forward's when nobody dumps
            if dumped or self.debugger is None:
                self.routing.flush(window.step, rank, dumped, window.requests or [])
            else:
                self.routing.discard()


def _log_for(root: str) -> JsonlLog:
    if root not in _logs:
        _logs[root] = dispatch_log.open_log(root)
    return _logs[root]


def _generate_root(cfg: config_module.Config) -> str:
    if cfg.generate_config:
        dump_path = config_module.read_msprobe_config("MSPROBE_GENERATE_CONFIG", cfg.generate_config).get("dump_path")
        if dump_path:
            return str(dump_path)
    return cfg.generate_dump_root


def _own_debugger(config_path: str, root: str) -> Any | None:
    try:
        dbg = debugger.get_debugger(config_path, os.path.join(root, str(os.getpid())))
    except debugger.DebuggerUnavailable as exc:
        log.error("SGLang forwards are not dumped: %s", exc)
        return None
    from msprobe.pytorch import seed_all

    seed_all(mode=True)  # what SGLang's native switch does before it makes its debugger
    return dbg


def _graph_refusal(version: Version, server_args: Any, who: str, undo: str) -> str | None:
    for versions, field, graph_on, fix in records.GRAPH_SWITCHES:
        if version in SpecifierSet(versions) and getattr(server_args, field) == graph_on:
            return (
                f"SGLang {version} is asked to dump forwards with msprobe ({who}) while {field}={graph_on}: "
                f"msprobe records nothing inside a CUDA graph. To dump, {fix}; or {undo}."
            )
    return None


def graph_problem(ctx: PatchContext, server_args: Any) -> str | None:
    """Why a dump asked for here would come out empty because of CUDA graphs, or None."""
    cfg = ctx.config
    version = release(ctx)
    if version < NATIVE_FROM and cfg is not None and cfg.generate_config:
        return _graph_refusal(version, server_args, "MSPROBE_GENERATE_CONFIG", "unset MSPROBE_GENERATE_CONFIG")
    if version in _NATIVE_GRAPH_CHECK and server_args.msprobe_dump_config is not None:
        return _graph_refusal(version, server_args, "--msprobe-dump-config", "drop --msprobe-dump-config")
    return None


def _setup(runner: Any, ctx: PatchContext) -> SglangRunner | None:
    global _warned_unused_config
    cfg = ctx.config
    if cfg is None:
        return None
    release_version = release(ctx)
    version = str(release_version)
    native = getattr(runner, "msprobe_debugger", None) if release_version >= NATIVE_FROM else None
    if native is not None:
        root = os.path.abspath(debugger.dump_root(native))
        if id(native) not in _redirected:  # the draft runner of a process shares the debugger
            _redirected.add(id(native))
            debugger.set_dump_root(native, os.path.join(root, str(os.getpid())))
        return SglangRunner(native, own=False, dump_all=True, rank_id=None, engine_version=version, log=_log_for(root))
    root = _generate_root(cfg)
    ours = None
    rank_id = None
    if release_version < NATIVE_FROM and cfg.generate_config:
        ours = _own_debugger(cfg.generate_config, root)
        rank_id = runner.gpu_id if ours is not None and runner.dp_size is not None and runner.dp_size > 1 else None
    elif cfg.generate_config and not _warned_unused_config:
        _warned_unused_config = True
        log.warning(
            "SGLang %s dumps with its own switch: MSPROBE_GENERATE_CONFIG only places the dispatch log; "
            "to dump, start SGLang with --msprobe-dump-config %s "
            "(verl: ++actor_rollout_ref.rollout.engine_kwargs.sglang.msprobe_dump_config=%s)",
            version,
            cfg.generate_config,
            cfg.generate_config,
        )
    return SglangRunner(
        ours,
        own=ours is not None,
        dump_all=cfg.generate_forwards == config_module.EVERY_FORWARD,
        rank_id=rank_id,
        engine_version=version,
        log=_log_for(root),
    )


# --- wrappers ------------------------------------------------------------------------------------


def _begin(runner: SglangRunner, instance: Any, args: tuple, kwargs: dict) -> StepWindow:
    return runner.begin(instance.model, argument(args, kwargs, "forward_batch", 0))


def patch(module: ModuleType, ctx: PatchContext) -> None:
    cls = module.ModelRunner
    parameters = list(inspect.signature(cls.__init__).parameters)
    if "server_args" not in parameters:
        raise patching.TargetChanged("ModelRunner.__init__ has no server_args parameter")
    release(ctx)  # an unreadable version stops the patch here, not in a forward
    server_args_at = parameters.index("server_args") - 1  # among __init__'s arguments after self

    def graph_check(args: tuple, kwargs: dict) -> str | None:
        # Bad arguments: the wrapped call reports them itself.
        return graph_problem(ctx, argument(args, kwargs, "server_args", server_args_at))

    def attach_setup(runner: Any) -> None:
        setattr(runner, _STATE_ATTR, _setup(runner, ctx))

    def init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        problem = ctx.guarded("checking ModelRunner's server_args for CUDA graphs", graph_check, args, kwargs)
        if problem:  # refused before the model loads, on purpose: the dump asked for would be empty
            log.error("%s", problem)
            raise GraphModeRefused(problem)
        result = wrapped(*args, **kwargs)
        ctx.guarded("setting up the runner's dump and dispatch log", attach_setup, instance)
        state = getattr(instance, _STATE_ATTR, None)
        if state is not None:  # the model is loaded by now
            ctx.guarded("recording the engine's numerics settings", evidence.describe_engine, state, instance)
            if state.debugger is not None or ctx.config.routing:
                asked = ctx.config.routing
                ctx.guarded("setting the MoE routers' capture", state.bind_routing, instance.model, asked)
        return result

    ctx.wrap(cls, "__init__", init)
    ctx.wrap(cls, "forward", forward_wrapper(ctx))


def forward_wrapper(ctx: PatchContext) -> Any:
    """The wrapper of ``ModelRunner.forward``: the forward's line (and dump window) around it."""

    def forward(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        runner: SglangRunner | None = getattr(instance, _STATE_ATTR, None)
        if runner is None:
            return wrapped(*args, **kwargs)
        window = ctx.guarded("starting the forward's dump and log line", _begin, runner, instance, args, kwargs)
        try:
            return wrapped(*args, **kwargs)
        finally:
            if window is not None:
                ctx.guarded("ending the forward's dump and log line", runner.end, window)

    return forward
