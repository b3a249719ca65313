"""Bad input at start-up: every variable of ``config.VARIABLES`` with a bad value, and an unwritable dump root.

The bad value of each variable is found, not listed: the first of :data:`CANDIDATES` that
``config.load`` (plus the activation's patch-name check) refuses. A variable that takes every
candidate is one the library does not read at start-up, which its table must then say ("Not ours").
Each refused value runs a host under the shim: one line naming the variable and the value and what
is accepted, exit status 2, the host's code never ran, nothing written; the same with
``MSPROBE_HOOKS_STRICT=1``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.interpreter import run_python, shim_env

from msprobe_hooks import config as config_module
from msprobe_hooks.config import VARIABLES, ConfigError
from msprobe_hooks.patches import all_patches

from . import fault_matrix as fm

CANDIDATES = ("bogus", "/proc/bogus", "no-such-module:ATTRIBUTE", "bogus,,bogus")
HOST = "print('the host ran')"


def refused(name: str, value: str, tmp: Path) -> bool:
    environ = {"DUMP_ON": "1", "MSPROBE_HOOKS_OUTPUT_DIR": str(tmp / "out"), name: value}
    try:
        cfg = config_module.load(environ)
        config_module.check_patch_names(cfg, [p.name for p in all_patches()])
        if cfg.extra_patches:
            all_patches(cfg.extra_patches)
    except (ConfigError, ImportError):
        return True
    return False


def bad_value(name: str, tmp: Path) -> str | None:
    return next((value for value in CANDIDATES if refused(name, value, tmp)), None)


def assert_refused(tmp: Path, name: str, value: str, tally: fm.Tally, **extra: str) -> None:
    out = tmp / "out"
    env = {"DUMP_ON": "1", "MSPROBE_HOOKS_OUTPUT_DIR": str(out), name: value, **extra}
    before = sorted(os.listdir(tmp))
    result = run_python(HOST, shim_env(**env), cwd=tmp)
    tally.runs += 1
    assert result.returncode == 2, result.stderr
    assert "the host ran" not in result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and fm.our_lines(result.stderr) == lines, result.stderr
    assert f"{name}=" in lines[0] and "accepted:" in lines[0], lines[0]
    assert sorted(os.listdir(tmp)) == before and not out.exists()  # nothing written


@pytest.mark.parametrize("variable", VARIABLES, ids=[v.name for v in VARIABLES])
def test_a_bad_value_is_one_line_exit_2_nothing_written(variable, tmp_path):
    value = bad_value(variable.name, tmp_path)
    with fm.cell("bad environment variable", fm.START_UP) as tally:
        if value is None:
            assert variable.meaning.startswith("Not ours"), f"{variable.name} takes any value: {variable}"
            return
        assert_refused(tmp_path, variable.name, value, tally)
        if variable.name != "MSPROBE_HOOKS_STRICT":
            assert_refused(tmp_path, variable.name, value, tally, MSPROBE_HOOKS_STRICT="1")


def test_an_unwritable_dump_root_is_refused_at_start_up(tmp_path):
    with fm.cell("dump root unwritable at start-up", fm.START_UP) as tally:
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        for root in ("/proc/msprobe", str(blocker / "dumps")):
            assert_refused(tmp_path, "MSPROBE_HOOKS_OUTPUT_DIR", root, tally)
