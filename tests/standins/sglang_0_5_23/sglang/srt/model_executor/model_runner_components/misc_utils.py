"""Stand-in for model_runner_components/misc_utils.py of 0.5.23."""

from typing import Any

from sglang_common import new_msprobe_debugger

from sglang.srt.runtime_context import get_observability


def create_msprobe_debugger() -> Any | None:
    if get_observability().msprobe_dump_config is None:
        return None
    return new_msprobe_debugger(get_observability().msprobe_dump_config)
