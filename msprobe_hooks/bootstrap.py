"""Activation: validate the configuration once, set up logging, register the lazy patches.

The shim calls :func:`activate_from_shim`; code that cannot use the shim (a Ray
``worker_process_setup_hook``, a notebook) calls :func:`activate`. Neither imports torch,
msprobe or any patch target: patches are applied when their targets are imported.
"""

from __future__ import annotations

import os
import sys

from msprobe_hooks import config as config_module
from msprobe_hooks import log, patching
from msprobe_hooks.config import Config, ConfigError
from msprobe_hooks.patches import all_patches, msprobe_writes

_active: Config | None = None


def activate(environ: dict[str, str] | None = None) -> Config | None:
    """Activate in this process when DUMP_ON is on; idempotent. Raises ConfigError on bad input."""
    global _active
    if _active is not None:
        return _active
    env = os.environ if environ is None else environ
    cfg = config_module.load(env)
    if not cfg.enabled:
        return None
    try:
        # msprobe's own writes are guarded beside the catalogue (patches/msprobe_writes.py says why).
        patches = [*all_patches(cfg.extra_patches), msprobe_writes.PATCH]
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        name = config_module.PREFIX + "EXTRA_PATCHES"
        raise ConfigError([config_module.invalid(name, env.get(name, ""), f"{type(exc).__name__}: {exc}")]) from None
    config_module.check_patch_names(cfg, [p.name for p in patches])
    log.set_level(cfg.log_level)
    env.update(config_module.pinned_environment(cfg, env))
    for name in cfg.unknown_names:
        hint = config_module.suggest(name)
        log.logger().warning("unknown variable %s ignored%s", name, f" (did you mean {hint}?)" if hint else "")
    _active = cfg
    patching.register(patches, cfg)
    return cfg


def activate_from_shim() -> None:
    """The shim's entry point: a bad configuration stops the process (exit 2) before user code runs.

    ``os._exit``, not SystemExit: during ``site`` start-up SystemExit becomes a fatal-error traceback
    and status 1. Nothing has run yet that an exit handler would need to flush.
    """
    try:
        activate()
    except ConfigError as exc:
        for problem in exc.problems:
            sys.stderr.write(f"msprobe-hooks: error: {problem}\n")
        sys.stderr.flush()
        os._exit(2)


def current_config() -> Config | None:
    """The configuration this process activated with, or None when inactive."""
    return _active


def deactivate() -> None:
    """Revert all patches and forget the activation (tests)."""
    global _active
    patching.unpatch_all()
    _active = None
