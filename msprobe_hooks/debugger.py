"""The process's one msprobe ``PrecisionDebugger``, shared by every patch that dumps.

msprobe's debugger is a silent process singleton: a second construction with another config
returns the first object. So this module creates it once, remembers which config and dump root
it was made for, and refuses (one clear line) a second, different request instead of letting
two users corrupt each other's dumps. The step/recording helpers read msprobe internals that
are pinned by the supported msprobe versions (``MSPROBE_SUPPORTED``) and covered by tests.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from msprobe_hooks.join_keys import rank_folder
from msprobe_hooks.patching import Refusal

MSPROBE_DISTRIBUTION = "mindstudio-probe"
MSPROBE_MODULE = "msprobe"
MSPROBE_SUPPORTED = ">=26.2,<26.3"
DEFAULT_ACTOR_CONFIG = os.path.join(os.path.dirname(__file__), "data", "default_actor_config.json")


class DebuggerUnavailable(Refusal):
    """msprobe cannot be imported, or the process's debugger was made for something else."""


class ConfigRejected(RuntimeError):
    """msprobe refused to build a debugger from the config (a field our start-up check does not know)."""


_lock = threading.Lock()
_created_for: tuple[str, str] | None = None  # (config path, dump root) of the debugger we made
_rejected: dict[tuple[str, str], str] = {}  # what msprobe refused to make a debugger for, and its line


def _precision_debugger_class() -> Any:
    try:
        from msprobe.pytorch import PrecisionDebugger
    except ImportError as exc:
        raise DebuggerUnavailable(
            f"DUMP_ON=1 needs msprobe, which {sys.executable} cannot import ({exc}); "
            f"install it with: pip install 'mindstudio-probe{MSPROBE_SUPPORTED}'"
        ) from None
    return PrecisionDebugger


def existing() -> Any | None:
    """The debugger someone already initialised in this process (us, verl's profiler, an engine), or None."""
    module = sys.modules.get("msprobe.pytorch")
    instance = getattr(getattr(module, "PrecisionDebugger", None), "_instance", None)
    return instance if getattr(instance, "initialized", False) else None


def rejected(config_path: str, dump_root: str) -> bool:
    """Whether msprobe refused ``config_path`` (for ``dump_root``) in this process: nothing is dumped under it."""
    return (config_path, dump_root) in _rejected


def get_debugger(config_path: str, dump_root: str) -> Any:
    """The process debugger for ``config_path`` dumping under ``dump_root``; created on first use."""
    global _created_for
    with _lock:
        wanted = (config_path, dump_root)
        if _created_for == wanted:
            return existing()
        if wanted in _rejected:  # msprobe said no once; it would say so again
            raise ConfigRejected(_rejected[wanted])
        if _created_for is not None or existing() is not None:
            made_by = f"msprobe-hooks for {_created_for[0]}" if _created_for else "another component"
            raise DebuggerUnavailable(
                f"this process already has an msprobe debugger (made by {made_by}); msprobe allows one "
                f"per process, so {config_path} cannot get its own"
            )
        cls = _precision_debugger_class()
        try:
            debugger = cls(config_path=config_path, dump_path=dump_root)
        except Exception as exc:  # msprobe checks more than config.read_msprobe_config does
            # msprobe keeps its half-made singleton, which would pass for a debugger of someone else's.
            cls._instance = None
            _rejected[wanted] = (
                f"msprobe rejected the config {config_path} ({type(exc).__name__}: {exc}; "
                "msprobe's own error line says which field)"
            )
            raise ConfigRejected(_rejected[wanted]) from exc
        _created_for = wanted
        return debugger


def next_step(debugger: Any) -> int:
    """The ``step{N}`` folder the next ``start()`` dumps into."""
    service = debugger.service
    return int(service.loop + service.init_step)


def dump_root(debugger: Any) -> str:
    """The folder the debugger creates its ``step{N}/`` folders in."""
    return str(debugger.service.config.dump_path)


def set_dump_root(debugger: Any, path: str) -> None:
    """Send later steps elsewhere, also after msprobe reloads its config file.

    msprobe reads ``service.config.dump_path`` at every ``start()`` (as verl's own integration
    relies on). A config hot reload (``dump_enable`` in the file) rebuilds that config from the file
    and the constructor's overrides, so the debugger's config and the override are set too: an
    engine's native debugger keeps dumping into the folder chosen for it (one per process).
    """
    debugger.service.config.dump_path = path
    debugger.config.dump_path = path
    overrides = getattr(debugger, "_overrides", None)
    if isinstance(overrides, dict):
        overrides["dump_path"] = path


def step_dumped(debugger: Any, step: int) -> bool:
    """Whether msprobe recorded ``step{step}`` (it makes that folder only for a step it records); call after stop()."""
    service = debugger.service
    return getattr(service, "dump_iter_dir", None) == os.path.join(service.config.dump_path, f"step{step}")


def step_folder(debugger: Any, step: int) -> str | None:
    """msprobe's ``step{N}/rank{R}`` folder (``proc{pid}`` when it knew no rank) of a step it recorded, else None; call
    after stop()."""
    if not step_dumped(debugger, step):
        return None
    return os.path.join(debugger.service.dump_iter_dir, rank_folder(dump_rank(debugger), os.getpid()))


def dump_rank(debugger: Any) -> int | None:
    """The rank msprobe names its ``rank{R}`` folders after; None until the first recorded step."""
    rank = debugger.service.current_rank
    return None if rank is None else int(rank)


def is_recording() -> bool:
    """Whether msprobe is recording right now (after a start() that passed its step/rank filters)."""
    from msprobe.core.common.runtime import Runtime

    return bool(Runtime.is_running)


def stop_recording(debugger: Any) -> None:
    """Turn msprobe's recording off when its ``stop()`` failed: its hooks stay in place, inert, as after a stop().

    Left recording, msprobe would run its hooks through the host's next, undumped forward (and its
    API hooks change float results in the last bits). What the failed step recorded is not flushed.
    """
    from msprobe.core.common.runtime import Runtime

    Runtime.is_running = False
    debugger.service.primitive_switch = False


def has_finished(debugger: Any) -> bool:
    """msprobe shut itself down for good (its step filter is exhausted)."""
    return bool(debugger.service.should_stop_service)
