"""Patch ``verl.preflight``: check the consistency constraints once verl has composed its PPO config.

Every verl PPO entry point (``main_ppo``, the fully-async and one-step-off mains, verl 0.7 to 0.9)
first calls ``verl.utils.device.auto_set_device(config)``: in the driver, with the composed Hydra
config, before ``ray.init``. Under ``python -m verl.trainer.main_ppo`` that module runs as
``__main__``, so a patch on its own functions would never be reached; the function it imports by
name from ``verl.utils.device`` is, because the wrapper is in place as soon as that module is
imported. The check runs after ``auto_set_device`` has set ``trainer.device`` (``npu`` on Ascend,
which tells vLLM-Ascend from GPU vLLM).
"""

from __future__ import annotations

import logging
from types import ModuleType

from msprobe_hooks import preflight
from msprobe_hooks.config import PREFLIGHT_WARN, Config
from msprobe_hooks.patching import PatchContext, argument

FUNCTION = "auto_set_device"

log = logging.getLogger("msprobe_hooks")


class PreflightFailed(RuntimeError):
    """The run breaks pairing constraints and MSPROBE_HOOKS_PREFLIGHT=error: stop before any rollout."""


def _findings(config: object, settings: Config) -> tuple[list[preflight.Finding], list[str]] | None:
    if not preflight.is_ppo_config(config):
        return None  # SFT and eval entry points call auto_set_device too
    findings = preflight.check(config, settings)
    return findings, preflight.report(findings, "verl config")


def _check(ctx: PatchContext, config: object) -> None:
    settings = ctx.config
    if settings is None:
        return
    # Reading the config is guarded too: a config of a shape we do not know must not stop the run.
    checked = ctx.guarded("checking the run's configuration", _findings, config, settings)
    if checked is None:
        return  # not a PPO run, or our own failure: the user's run goes on
    findings, lines = checked
    if not findings:
        log.info("%s", lines[0])
        return
    if settings.preflight == PREFLIGHT_WARN:
        for line in lines:
            log.warning("%s", line)
        return
    hint = (
        "stopped before Ray starts: fix the settings above, or MSPROBE_HOOKS_PREFLIGHT=warn to run anyway "
        f"(MSPROBE_HOOKS_DISABLE={ctx.name} skips the check)"
    )
    raise PreflightFailed("\n".join([*lines, hint]))


def patch(module: ModuleType, ctx: PatchContext) -> None:
    def after_device_set(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        if ctx.active:  # a name imported from verl.utils.device before the revert passes straight through
            _check(ctx, argument(args, kwargs, "config", 0, None))
        return result

    ctx.wrap(module, FUNCTION, after_device_set)
