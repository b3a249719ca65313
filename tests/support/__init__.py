"""What the tests share; fixtures and hooks stay in ``tests/conftest.py``, everything else is here.

``pyproject.toml`` puts ``tests/`` (and the repository root, for :mod:`cpu_kit`) on ``sys.path``,
so a test imports ``from support.interpreter import run_python``. The ``*_child.py`` scripts run
as files in fresh interpreters and put those two folders on ``sys.path`` themselves.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Every stand-in the tests put in front of, or in place of, a real package (see its README.md).
STANDINS = REPO / "tests" / "standins"
