"""msprobe-hooks: msprobe precision dumps for verl + vLLM / vLLM-Ascend / SGLang from environment variables.

Put ``msprobe-hooks shim-path`` on ``PYTHONPATH`` and export ``DUMP_ON=1``; every Python process
of the job then activates this package (:func:`activate`) and patches its targets as they are
imported. :func:`status` tells what happened in this process.
"""

from __future__ import annotations

__version__ = "0.1.0"

from msprobe_hooks.bootstrap import activate, current_config, deactivate
from msprobe_hooks.patching import PatchStatus, status

__all__ = ["PatchStatus", "__version__", "activate", "current_config", "deactivate", "status"]
