"""The experts an inference engine's MoE routers chose, per token and layer: one line per dumped model step.

Whenever this process's patch drives an msprobe dump (``MSPROBE_GENERATE_CONFIG``), and on every step with
``MSPROBE_HOOKS_ROUTING=1``, an engine patch hands every router's top-k expert ids to a :class:`RoutingRecorder`
during the forward (vLLM: the capture hook of each ``MoERunner``'s router, the one vLLM's own routed-experts
capture uses) and writes them once the step is over, into ``{generate dump_path}/{pid}/routed_experts.jsonl``
beside the dispatch log, in the format both sides share (:mod:`msprobe_hooks.routing`), with ``requests``: whose
tokens they are, in the engine's packed order. Written only for dumped steps when a debugger runs (``dumped``;
the routers' ids of other steps are not even copied), for every step when none does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from msprobe_hooks.inference.dispatch_log import ScheduledRequest
from msprobe_hooks.join_keys import ROUTED_EXPERTS_LOG
from msprobe_hooks.jsonl import JsonlLog
from msprobe_hooks.routing import layer_of


class RoutingRecorder:
    """The ids captured during the current model step, per layer, until :meth:`flush` writes them."""

    def __init__(self, root: str) -> None:
        self.log = JsonlLog(root, ROUTED_EXPERTS_LOG)
        self.layers: dict[int, list[Any]] = {}
        self.routers = 0  # routers whose capture hook feeds this recorder
        self.armed = True  # the step in progress is written: False in a step a driven debugger does not dump

    def capture(self, layer: int, topk_ids: Any) -> None:
        """One router call's top-k ids ``[tokens, k]`` (a tensor); copied, the engine may reuse its buffer."""
        if not self.armed:
            return
        self.layers.setdefault(layer, []).append(topk_ids.detach().to("cpu", copy=True))

    def discard(self) -> None:
        self.layers = {}

    def flush(self, step: int, rank: int | None, dumped: bool, requests: Sequence[ScheduledRequest]) -> None:
        """Write what this step's routers chose (nothing when no router ran) and start the next step empty."""
        layers, self.layers = self.layers, {}
        if not layers:
            return
        import torch

        ids = {layer: torch.cat(parts) if len(parts) > 1 else parts[0] for layer, parts in sorted(layers.items())}
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
            "tokens": int(next(iter(ids.values())).shape[0]),
            "requests": rows,
            "layers": {str(layer): tensor.tolist() for layer, tensor in ids.items()},
        }
        self.log.write(record)


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


def _capture(recorder: RoutingRecorder, layer: int, previous: Any, guarded: Callable[..., Any]) -> Callable:
    def capture(topk_ids: Any) -> None:
        if previous is not None:
            previous(topk_ids)
        guarded("recording the routed experts", recorder.capture, layer, topk_ids)

    return capture
