"""The ``msprobe_hooks`` logger: one stderr line per event, set up on first use.

Importing ``logging`` costs several milliseconds, and activation runs in every Python process of
a job, so the logger is built only when something is about to be logged (a patch is applied, a
warning is due). Patch modules may use ``logging.getLogger("msprobe_hooks")`` directly: the
machinery calls :func:`logger` before importing them.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: activation stays light

if TYPE_CHECKING:
    import logging

NAME = "msprobe_hooks"
_level = "INFO"


def set_level(level: str) -> None:
    """Record the level (MSPROBE_HOOKS_LOG_LEVEL); applied when the logger is built, or at once."""
    global _level
    _level = level
    import sys

    if "logging" in sys.modules:
        logger().setLevel(level)


def logger() -> logging.Logger:
    import logging
    import sys

    log = logging.getLogger(NAME)
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[msprobe-hooks %(process)d] %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(_level)
        # Our own handler: the host's root logging configuration neither hides nor duplicates us.
        log.propagate = False
    return log
