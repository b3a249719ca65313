"""vLLM's V1 model runner: the dispatch log (GPU vLLM and vLLM-Ascend), msprobe dumps on GPU vLLM.

Patch ``vllm.model_runner`` wraps ``vllm.v1.worker.gpu_model_runner.GPUModelRunner``, which
vLLM-Ascend's ``NPUModelRunner`` inherits:

* ``__init__`` (after): the runner's :class:`.runner_state.VllmRunner`. With ``MSPROBE_GENERATE_CONFIG``
  set on GPU vLLM, this patch drives msprobe itself, as vLLM-Ascend does natively, provided the
  engine is eager (else it refuses, one error line) and the runner class runs vLLM's own
  ``execute_model``. It also puts back any of these wrappers that something replaced since
  import: vLLM-Ascend 0.13 swaps ``GPUModelRunner._update_states`` while it starts up.
* ``_update_states`` (after): the persistent batch is final here (condensed and reordered), so
  ``input_batch.req_ids`` is the order of the packed tokens (:mod:`.batch`); then, when driving
  msprobe, ``start()`` with the scheduled tokens in that order.
* ``execute_model`` / ``sample_tokens``, wrapped only with ``MSPROBE_GENERATE_CONFIG`` or
  ``MSPROBE_HOOKS_ROUTING``: when driving msprobe, ``stop()`` and ``step()`` once the step is over
  (``execute_model`` returned output, raised, or ``sample_tokens`` returned); with routing, the step's
  routed experts written (:mod:`msprobe_hooks.inference.routed_experts`). The routers' capture hooks are
  set on the first step, once the model is loaded (``get_model()``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

from msprobe_hooks.config import read_msprobe_config
from msprobe_hooks.inference.dispatch_log import open_log
from msprobe_hooks.log import logger
from msprobe_hooks.patches.vllm import VLLM_MODEL_RUNNER, evidence
from msprobe_hooks.patches.vllm.batch import not_eager, scheduled_requests
from msprobe_hooks.patches.vllm.runner_state import VllmRunner, set_state, state_of
from msprobe_hooks.patching import PatchContext, Refusal, TargetChanged, argument, is_ours

EAGER_HINT = "enforce_eager=True (--enforce-eager; verl: actor_rollout_ref.rollout.enforce_eager=True)"


class EngineNotEager(Refusal):
    """MSPROBE_GENERATE_CONFIG with a compiled or graph-captured engine (raised under MSPROBE_HOOKS_STRICT=1)."""


def _owner(cls: type, name: str) -> type | None:
    return next((klass for klass in cls.__mro__ if name in vars(klass)), None)


def _set_up(runner: Any, base: type, ctx: PatchContext) -> None:
    cfg = ctx.config
    if cfg is None:
        return
    state = VllmRunner(runner, cfg)
    set_state(runner, state)
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


def _record_step(ctx: PatchContext, runner: Any, state: VllmRunner, args: tuple, kwargs: dict) -> None:
    scheduler_output = argument(args, kwargs, "scheduler_output", 0)
    if not scheduler_output.total_num_scheduled_tokens:
        return
    # An engine loads its model before the first step (a reload replaces it); vLLM's own tests also step runners
    # that have none: those are described once it is loaded.
    loaded = getattr(runner, "model", None) is not None
    if loaded and not state.describes(runner):
        ctx.guarded("recording the engine's numerics settings", evidence.describe_engine, state, runner)
    new_requests = scheduler_output.scheduled_new_reqs
    if new_requests:
        ctx.guarded("recording the new requests", evidence.record_requests, state, new_requests)
    if loaded and (ctx.config.routing or state.drive_config is not None) and not state.routing_bound:
        ctx.guarded(
            "setting the MoE routers' capture", state.bind_routing, runner.get_model(), ctx.guarded, ctx.config.routing
        )
    if state.routing is not None:
        state.routing.discard()  # ids of forwards no step of ours covered (a dummy run)
    if state.drive_config is not None and state.debugger is None:
        state.create_debugger()
    requests = scheduled_requests(runner, scheduler_output, state)
    state.on_batch(requests)
    if state.drive_config is not None:
        state.start(runner, requests)


def _ends_steps(state: VllmRunner | None) -> TypeGuard[VllmRunner]:
    """Whether this runner has something to do once a step is over: a dump it drives, routers it records."""
    return state is not None and (state.drive_config is not None or state.routing is not None)


def _end_step(ctx: PatchContext, state: VllmRunner) -> None:
    ctx.guarded("ending the step's dump", state.finish)
    ctx.guarded("writing the step's logits", state.end_logits)
    ctx.guarded("writing the step's routed experts", state.end_routing)


# What only the end of a step needs (a dump driven, routers recorded): without MSPROBE_GENERATE_CONFIG or
# MSPROBE_HOOKS_ROUTING these wrappers would do nothing at every step.
DUMP_WRAPPERS = frozenset({"execute_model", "sample_tokens"})


def is_applied(module: Any) -> bool:
    """Whether this patch wraps ``module.GPUModelRunner`` now (the vLLM-Ascend patch needs it)."""
    return is_ours(vars(module.GPUModelRunner).get("__init__"), VLLM_MODEL_RUNNER.name)


def patch(module: Any, ctx: PatchContext) -> None:
    if ctx.config is None:
        raise TargetChanged("msprobe-hooks is not active in this process")
    runner_class = module.GPUModelRunner

    def init(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        result = wrapped(*args, **kwargs)
        # EngineNotEager (MSPROBE_HOOKS_STRICT=1) is a Refusal: it passes the guard and stops the engine.
        ctx.guarded("setting up the runner's dispatch log and dumps", set_up_runner, instance)
        return result

    def set_up_runner(runner: Any) -> None:
        replaced = install()
        if replaced:
            logger().info("re-applied %s to %s, replaced since import", ctx.name, ", ".join(replaced))
        _set_up(runner, runner_class, ctx)

    def update_states(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        state = state_of(instance)
        if state is None or state.depth:
            return wrapped(*args, **kwargs)
        state.depth += 1
        try:
            result = wrapped(*args, **kwargs)
        finally:
            state.depth -= 1
        ctx.guarded("recording the step's requests", _record_step, ctx, instance, state, args, kwargs)
        return result

    def execute_model(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        state = state_of(instance)
        if not _ends_steps(state):
            return wrapped(*args, **kwargs)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException:
            _end_step(ctx, state)
            raise
        if result is not None:  # output now (0.11.0, pooling, PP), else sample_tokens() ends the step
            _end_step(ctx, state)
        return result

    def sample_tokens(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        state = state_of(instance)
        if not _ends_steps(state):
            return wrapped(*args, **kwargs)
        try:
            return wrapped(*args, **kwargs)
        finally:
            _end_step(ctx, state)

    wrappers: dict[str, Callable[..., Any]] = {
        "__init__": init,
        "_update_states": update_states,
        "execute_model": execute_model,
        "sample_tokens": sample_tokens,  # 0.11.1+
    }
    dumps = bool(ctx.config.generate_config) or ctx.config.routing

    def install() -> list[str]:
        """Wrap every method (that this configuration needs) not, or no longer, wrapped; the names newly wrapped."""
        wrapped = []
        for name, wrapper in wrappers.items():
            if name not in vars(runner_class) or (name in DUMP_WRAPPERS and not dumps):
                continue
            if not ctx.is_wrapped(runner_class, name):
                ctx.wrap(runner_class, name, wrapper)
                wrapped.append(f"{runner_class.__qualname__}.{name}")
        return wrapped

    install()
