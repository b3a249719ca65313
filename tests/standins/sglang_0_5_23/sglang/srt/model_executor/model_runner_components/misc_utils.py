"""Stand-in for model_runner_components/misc_utils.py of 0.5.23."""

from typing import Any

from sglang.srt.runtime_context import get_observability


def create_msprobe_debugger() -> Any | None:
    if get_observability().msprobe_dump_config is None:
        return None
    try:
        from msprobe.pytorch import PrecisionDebugger, seed_all
    except ImportError:
        return None
    seed_all(mode=True)
    return PrecisionDebugger(config_path=get_observability().msprobe_dump_config)
