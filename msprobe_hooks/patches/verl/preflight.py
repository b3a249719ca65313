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

from msprobe_hooks import bootstrap, preflight
from msprobe_hooks.config import PREFLIGHT_WARN
from msprobe_hooks.patching import unwrap_method, wrap_method

NAME = "verl.preflight"
FUNCTION = "auto_set_device"

log = logging.getLogger("msprobe_hooks")

# Names imported from verl.utils.device before unpatch() keep the wrapper: it then passes straight through.
_active = False


class PreflightFailed(RuntimeError):
    """The run breaks pairing constraints and MSPROBE_HOOKS_PREFLIGHT=error: stop before any rollout."""


def _check(config: object) -> None:
    settings = bootstrap.current_config()
    if settings is None or not preflight.is_ppo_config(config):
        return  # SFT and eval entry points call auto_set_device too
    try:
        findings = preflight.check(config, settings)  # type: ignore[arg-type]
        lines = preflight.report(findings, "verl config")
    except Exception as exc:  # our own failure must not stop the user's run
        log.warning("preflight could not check this run and steps aside: %s: %s", type(exc).__name__, exc)
        log.debug("preflight failure", exc_info=True)
        return
    if not findings:
        log.info("%s", lines[0])
        return
    if settings.preflight == PREFLIGHT_WARN:
        for line in lines:
            log.warning("%s", line)
        return
    hint = (
        "stopped before Ray starts: fix the settings above, or MSPROBE_HOOKS_PREFLIGHT=warn to run anyway "
        f"(MSPROBE_HOOKS_DISABLE={NAME} skips the check)"
    )
    raise PreflightFailed("\n".join([*lines, hint]))


def _after_device_set(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    if _active:
        _check(args[0] if args else kwargs.get("config"))
    return result


def patch(module: ModuleType) -> None:
    global _active
    wrap_method(module, FUNCTION, _after_device_set, NAME)
    _active = True


def unpatch(module: ModuleType) -> None:
    global _active
    _active = False
    unwrap_method(module, FUNCTION, NAME)
