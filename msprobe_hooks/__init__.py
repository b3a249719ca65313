"""msprobe-hooks: msprobe precision dumps for verl + vLLM / vLLM-Ascend / SGLang from environment variables.

Put ``msprobe-hooks shim-path`` on ``PYTHONPATH`` and export ``DUMP_ON=1``; every Python process
of the job then activates this package (:func:`activate`) and patches its targets as they are
imported. :func:`status` tells what happened in this process.

The names below are handed on from :mod:`.bootstrap` and :mod:`.patching` on first use: importing
the package itself loads nothing (the command line and every activated process import it).
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["PatchStatus", "__version__", "activate", "current_config", "deactivate", "status"]

_HANDED_ON = {
    "activate": "bootstrap",
    "current_config": "bootstrap",
    "deactivate": "bootstrap",
    "PatchStatus": "patching",
    "status": "patching",
}


def __getattr__(name: str) -> object:
    if name not in _HANDED_ON:
        raise AttributeError(f"module 'msprobe_hooks' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{_HANDED_ON[name]}"), name)
