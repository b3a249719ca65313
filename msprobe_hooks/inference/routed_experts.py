"""The experts an inference engine's MoE routers chose, per token and layer: one line per dumped model step.

Whenever a dump is taken in this process (vLLM: the steps this process's patch drives with
``MSPROBE_GENERATE_CONFIG``; SGLang: the forwards its debugger dumps, its own switch or ours), and on every step with
``MSPROBE_HOOKS_ROUTING=1``, an engine patch hands every router's choice to a :class:`RoutingRecorder` during the
forward and writes it once the step is over, into ``{generate dump_path}/{pid}/routed_experts.jsonl`` beside the
dispatch log, in the format both sides share (:mod:`msprobe_hooks.routing`), with ``requests``: whose tokens they
are, in the engine's packed order. vLLM: the top-k ids, from the capture hook of each ``MoERunner``'s router (the one
vLLM's own routed-experts capture uses), copied there (vLLM reuses the buffer). SGLang: a forward hook on each
``TopK`` module keeps its output (ids and the router's logits: the margins too) and the step's end reads it, so no
tensor op runs inside msprobe's window. Written only for dumped steps when a debugger runs (``dumped``), for every
step when none does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from msprobe_hooks.inference.dispatch_log import ScheduledRequest
from msprobe_hooks.join_keys import ROUTED_EXPERTS_LOG
from msprobe_hooks.jsonl import JsonlLog
from msprobe_hooks.log import logger
from msprobe_hooks.routing import choices_by_layer, layer_of

# SGLang's top-k module (sglang.srt.layers.moe.topk.TopK): its output holds topk_ids and router_logits.
SGLANG_TOPK = "TopK"


class RoutingRecorder:
    """The router calls of the current model step, per layer, until :meth:`flush` writes their choices."""

    def __init__(self, root: str) -> None:
        self.log = JsonlLog(root, ROUTED_EXPERTS_LOG)
        self.layers: dict[int, list[Any]] = {}  # per layer, each call: vLLM's copied ids, SGLang's TopK output
        self.routers = 0  # routers whose capture hook feeds this recorder
        self.armed = True  # the step in progress is written: False in a step a driven debugger does not dump

    def capture(self, layer: int, topk_ids: Any) -> None:
        """One router call's top-k ids ``[tokens, k]`` (a tensor); copied, the engine may reuse its buffer."""
        if not self.armed:
            return
        self.layers.setdefault(layer, []).append(topk_ids.detach().to("cpu", copy=True))

    def discard(self) -> None:
        """Forget the calls so far. The lists stay: SGLang's hooks append to them."""
        for calls in self.layers.values():
            calls.clear()

    def flush(self, step: int, rank: int | None, dumped: bool, requests: Sequence[ScheduledRequest]) -> None:
        """Write what this step's routers chose (nothing when no router ran) and start the next step empty."""
        layers = {layer: [_choice_source(call) for call in calls] for layer, calls in self.layers.items() if calls}
        self.discard()
        if not layers:
            return
        ids, margins = choices_by_layer(layers)
        if not ids:
            return
        offset, rows = 0, []
        for request in requests:
            rows.append(
                {
                    "request_id": request.request_id,
                    "request_id_base": request.request_id_base,
                    "offset": offset,
                    "tokens": request.tokens,
                }
            )
            offset += request.tokens
        record = {
            "step": step,
            "rank": rank,
            "dumped": dumped,
            "tokens": len(next(iter(ids.values()))),
            "requests": rows,
            "layers": ids,
        }
        if margins:
            record["margins"] = margins
        self.log.write(record)


def recorder_for(
    root: str, model: Any, asked: bool, bind: Callable[[Any, RoutingRecorder], int]
) -> RoutingRecorder | None:
    """A recorder under ``root`` fed by every MoE router of ``model`` that ``bind`` (:func:`bind` with its guard, or
    :func:`bind_topk_modules`) hooks, or None when it finds none; ``asked``: by ``MSPROBE_HOOKS_ROUTING`` (a model
    without routers then says so), not only by a dump."""
    recorder = RoutingRecorder(root)
    if bind(model, recorder):
        logger().info("%d MoE routers recorded in %s", recorder.routers, ROUTED_EXPERTS_LOG)
        return recorder
    if asked:
        logger().info(
            "MSPROBE_HOOKS_ROUTING is set but this model has no MoE router the hooks can read "
            "(vLLM: a router with set_capture_fn; SGLang: a TopK module): no %s in this worker",
            ROUTED_EXPERTS_LOG,
        )
    return None


def bind(model: Any, recorder: RoutingRecorder, guarded: Callable[..., Any]) -> int:
    """Hand every MoE router of ``model`` that has a capture hook to ``recorder``; the number of routers bound.

    A router is a module's ``router`` attribute with ``set_capture_fn`` (vLLM's ``MoERunner``); a capture
    hook already set (vLLM's own routed-experts capture) keeps being called, first. ``guarded`` runs our
    part so that a failure never reaches the engine's forward.
    """
    bound = 0
    for name, module in model.named_modules():
        router = getattr(module, "router", None)
        if router is None or not callable(getattr(router, "set_capture_fn", None)):
            continue
        layer = layer_of(name, getattr(module, "layer_id", None))
        if layer is None:
            continue
        previous = getattr(router, "capture_fn", None)
        router.set_capture_fn(_capture(recorder, layer, previous, guarded))
        bound += 1
    recorder.routers = bound
    return bound


def _choice_source(call: Any) -> Any:
    """What :func:`~msprobe_hooks.routing.router_choice` reads of a kept call: an SGLang ``TopK`` output's router
    logits and ids (its weights would hide the margins), else the call as kept (vLLM's copied ids)."""
    ids = getattr(call, "topk_ids", None)
    return call if ids is None else (getattr(call, "router_logits", None), ids)


def bind_topk_modules(model: Any, recorder: RoutingRecorder) -> int:
    """Keep the output of every SGLang ``TopK`` module of ``model`` for ``recorder`` (a forward hook each, which
    returns nothing: the output goes on unchanged); the number of modules hooked. The hook runs in every forward
    once a dump is configured, dumped or not: it only appends the output to its layer's list (nothing there can
    fail into the forward, so it needs no guard; no tensor op runs inside msprobe's window), and the forward's end
    reads or drops it, guarded."""
    bound = 0
    for name, module in model.named_modules():
        if type(module).__name__ != SGLANG_TOPK:
            continue
        layer = layer_of(name, getattr(module, "layer_id", None))
        if layer is None:
            continue
        module.register_forward_hook(_keeper(recorder.layers.setdefault(layer, [])))
        bound += 1
    recorder.routers = bound
    return bound


def _keeper(calls: list[Any]) -> Callable:
    def keep(module: Any, args: Any, output: Any) -> None:
        calls.append(output)

    return keep


def _capture(recorder: RoutingRecorder, layer: int, previous: Any, guarded: Callable[..., Any]) -> Callable:
    def capture(topk_ids: Any) -> None:
        if previous is not None:
            previous(topk_ids)
        guarded("recording the routed experts", recorder.capture, layer, topk_ids)

    return capture
