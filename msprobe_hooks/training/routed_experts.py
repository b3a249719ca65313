"""The experts the training model's MoE routers chose in a dumped window: one ``routed_experts.jsonl`` line each.

msprobe's statistics of an integer tensor are its max and min: a statistics dump of an MoE model cannot say which
experts a token went to, and routing is then never compared. So while a window is open, a forward hook on each of
the model's routers (modules whose class is a router: Hugging Face's ``*TopKRouter``, Megatron's ``TopKRouter``)
keeps a reference to what it returned; once msprobe stopped (our tensor reads stay out of its dump), the window's
line is written to ``{training root}/{pid}/routed_experts.jsonl`` in the format both sides share
(:mod:`msprobe_hooks.routing`: ids and, from the router's logits, each token's top-k margin), only for a window
msprobe recorded. A model with no router gets no hook and no line. Nothing here imports torch at import time.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from msprobe_hooks.join_keys import ROUTED_EXPERTS_LOG
from msprobe_hooks.jsonl import JsonlLog
from msprobe_hooks.routing import choices_by_layer, layer_of


def _routers(model: Any) -> list[tuple[int, str, Any]]:
    """(layer, name, module) of every router in ``model`` (a module, or a list of pipeline chunks)."""
    found = []
    for chunk in model if isinstance(model, list | tuple) else (model,):
        for name, module in getattr(chunk, "named_modules", lambda: ())():
            if "router" in type(module).__name__.lower():
                layer = layer_of(name, getattr(module, "layer_number", None))
                if layer is not None:
                    found.append((layer, name, module))
    return found


class RouterWatch:
    """One process's routers watched during its dumped windows, and the log their choices go to."""

    def __init__(self, root_of: Callable[[Any], str]) -> None:
        self._root_of = root_of  # the training dump root of a config: the log is made at the first watch
        self.log: JsonlLog | None = None
        self._known: weakref.WeakKeyDictionary[Any, list[tuple[int, str, Any]]] = weakref.WeakKeyDictionary()
        self._handles: list[Any] = []
        self._outputs: dict[int, list[Any]] = {}  # layer -> what its router returned in this window

    def watch(self, cfg: Any, model: Any) -> None:
        """Hook the routers of ``model`` for the window about to run (looked for once per model); ``cfg``: the
        process's config, whose training dump root the log goes under."""
        self.release()
        if self.log is None:
            self.log = JsonlLog(self._root_of(cfg), ROUTED_EXPERTS_LOG)
        key = model[0] if isinstance(model, list | tuple) and model else model
        try:
            routers = self._known[key]
        except KeyError:
            routers = self._known[key] = _routers(model)
        except TypeError:  # not weak-referenceable: looked for every window
            routers = _routers(model)
        for layer, _, module in routers:
            self._handles.append(module.register_forward_hook(self._keeper(layer)))

    def _keeper(self, layer: int) -> Any:
        def keep(module: Any, args: Any, output: Any) -> None:
            self._outputs.setdefault(layer, []).append(output)  # a reference: no tensor op inside msprobe's window

        return keep

    def release(self) -> None:
        """Remove the window's hooks and forget what they kept."""
        for handle in self._handles:
            handle.remove()
        self._handles, self._outputs = [], {}

    def write(self, step: int, rank: Any, global_step: Any) -> None:
        """The closed window's line (none when no router ran), then :meth:`release`."""
        outputs = self._outputs
        self.release()
        if not outputs or self.log is None:
            return
        layers, margins = choices_by_layer(outputs)  # a call whose output holds no choice is not a router
        if not layers:
            return
        record = {
            "step": step,
            "rank": rank,
            "dumped": True,
            "global_step": global_step,
            "tokens": len(next(iter(layers.values()))),
            "layers": layers,
        }
        if margins:
            record["margins"] = margins
        self.log.write(record)
