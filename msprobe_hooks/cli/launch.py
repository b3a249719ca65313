"""Putting the shim in front of a command: its folder, the PYTHONPATH, the environment to export."""

from __future__ import annotations

import importlib.util
import os
import shlex
from collections.abc import Mapping

from msprobe_hooks import config as config_module


def shim_dir() -> str:
    """The folder holding the shim's sitecustomize.py (the value for PYTHONPATH)."""
    spec = importlib.util.find_spec(config_module.SHIM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the sitecustomize_shim folder is not installed with msprobe_hooks; reinstall msprobe-hooks")
    return os.path.abspath(list(spec.submodule_search_locations)[0])


def pythonpath_with_shim(current: str | None) -> str:
    """PYTHONPATH with the shim first and no other copy of it."""
    here = shim_dir()
    rest = [p for p in (current or "").split(os.pathsep) if p and os.path.abspath(p) != here]
    return os.pathsep.join([here, *rest])


def job_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with the shim on PYTHONPATH and every path variable made absolute.

    Raises ConfigError when a variable is invalid, so a launcher fails before the job starts.
    """
    env = dict(environ)
    cfg = config_module.load(env)
    env.update(config_module.pinned_environment(cfg, env))
    env["PYTHONPATH"] = pythonpath_with_shim(env.get("PYTHONPATH"))
    return env


def export_lines(environ: Mapping[str, str]) -> list[str]:
    """Shell lines that switch the hooks on in the current shell (``msprobe-hooks env``)."""
    env = job_environment({**environ, "DUMP_ON": environ.get("DUMP_ON") or "1"})
    lines = [f'export PYTHONPATH={shlex.quote(shim_dir())}"${{PYTHONPATH:+:$PYTHONPATH}}"']
    for var in config_module.VARIABLES:
        value = env.get(var.name)
        if value is not None:
            lines.append(f"export {var.name}={shlex.quote(value)}")
        elif var.suggested:
            lines.append(f"export {var.name}={shlex.quote(var.suggested)}")
        elif var.name in _OPTIONAL_CONFIGS:
            lines.append(f"# export {var.name}=/path/to/config.json   # {_OPTIONAL_CONFIGS[var.name]}")
    return lines


_OPTIONAL_CONFIGS = {
    "MSPROBE_ACTOR_CONFIG": "unset: built-in statistics config, level mix",
    "MSPROBE_GENERATE_CONFIG": "only for SGLang < 0.5.11 and GPU vLLM (no native msprobe switch)",
}
