"""Dispatch-log lines as a reader sees them, built by the real encoder."""

from __future__ import annotations

import json

from msprobe_hooks.inference.dispatch_log import step_line


def step_record(**fields) -> dict:
    """The line :func:`msprobe_hooks.inference.dispatch_log.step_line` writes, read back."""
    return json.loads(step_line(**fields))
