"""The rollout's logits of a dumped step, kept by the hooks where msprobe does not dump them.

msprobe 26.2 hooks no module that is a model's second or last whenever ``verl`` is imported in the process (its
"verl scenario", ``ModuleProcessor.register_module_hook``): in a vLLM worker of verl's rollout the last is the
logits processor, so verl's own trainer never has the rollout's logits in a dump. In tensor mode, a
:class:`LogitsKeeper` then keeps that module's output during each dumped step (a forward hook of ours; a copy: verl
masks the logits in place afterwards) and writes it beside msprobe's ``dump.json`` once the step is over
(``join_keys.LOGITS_FILE``), where ``compare``'s logits check reads it (docs/analysis.md, "The logits"). Nothing is
kept or written for a step msprobe does not dump.
"""

from __future__ import annotations

import os
from typing import Any

from msprobe_hooks.config import TENSOR_TASK
from msprobe_hooks.join_keys import LOGITS_FILE
from msprobe_hooks.log import logger


class LogitsKeeper:
    """The logits processor's output of the step in progress, while ``armed`` (a step msprobe dumps)."""

    def __init__(self) -> None:
        self.armed = False
        self.kept: Any = None
        self._failed = False

    def hook(self, module: Any, args: Any, output: Any) -> None:
        """A forward hook: never changes the output, never raises into the engine."""
        if not self.armed:
            return
        try:
            self.kept = output.detach().to("cpu", copy=True)
        except Exception as exc:  # noqa: BLE001  (a failure here must not reach the engine's forward)
            self.kept = None
            if not self._failed:
                self._failed = True
                logger().warning(
                    "the rollout's logits cannot be kept for the logits check (%s); the engine goes on", exc
                )

    def write(self, folder: str | None) -> None:
        """The kept logits into ``folder`` (msprobe's folder of the step: None when it dumped none); then nothing is
        kept."""
        kept, self.kept, self.armed = self.kept, None, False
        if kept is None or folder is None:
            return
        import torch

        torch.save(kept, os.path.join(folder, LOGITS_FILE))


def keeper_for(model: Any, debugger: Any) -> LogitsKeeper | None:
    """A keeper hooked on ``model``'s logits processor where msprobe dumps values (tensor mode) and left that module
    out; None otherwise (msprobe dumps the logits itself, or its statistics have no values to check)."""
    processor = getattr(model, "logits_processor", None)
    task = getattr(getattr(debugger, "config", None), "task", None)
    if processor is None or task != TENSOR_TASK or getattr(processor, "msprobe_hook", False):
        return None
    keeper = LogitsKeeper()
    processor.register_forward_hook(keeper.hook)
    return keeper
