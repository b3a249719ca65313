"""Faults under the SGLang stand-ins (0.5.2: the library's own debugger dumps the forwards).

The stand-in scheduler (``tests/standins``, ``tests/support/sglang_standin.py``) drives the patched
``ModelRunner.forward`` with a tiny torch model; the fault site injects the fault as in the other
cells. Survived: the same outputs as without DUMP_ON, one line, every log line-complete; under
``MSPROBE_HOOKS_STRICT=1`` the run fails, naming the fault.
"""

from __future__ import annotations

import os

import pytest
from support.sglang_standin import env_for, run_scenario, write_config

from . import fault_matrix as fm
from .verl_faults import tmpfs

VERSION = "0.5.2"
SERVER_ARGS = {"disable_cuda_graph": True, "disable_overlap_schedule": True}  # no thread left waiting on a raise


def scenario(env: dict[str, str], faults: str = ""):
    env["PYTHONPATH"] += os.pathsep + str(fm.FAULT_SITE)
    env["FAULT_INJECT"] = faults
    return run_scenario(VERSION, env, server_args=SERVER_ARGS)


@pytest.fixture(scope="module")
def reference() -> dict:
    result = scenario(env_for(VERSION))
    assert result.returncode == 0, result.stderr[-3000:]
    return result.json()["outputs"]


@pytest.mark.parametrize("strict", ["0", "1"])
def test_msprobe_start_raising_leaves_the_forwards_unchanged(strict, tmp_path, reference):
    config = write_config(tmp_path)
    with fm.cell("msprobe start() raises", fm.SGLANG, strict=strict == "1") as tally:
        env = env_for(VERSION, DUMP_ON="1", MSPROBE_GENERATE_CONFIG=str(config), MSPROBE_HOOKS_STRICT=strict)
        result = scenario(env, "msprobe_start")
        tally.runs += 1
        if strict == "1":
            assert result.returncode != 0 and "PrecisionDebugger.start failed" in result.stderr
            return
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.json()["outputs"] == reference
        lines = fm.our_lines(result.stderr)
        assert len(lines) == 1 and "PrecisionDebugger.start failed" in lines[0], lines
        assert fm.check_logs(tmp_path / "dump", tally) > 0  # the dispatch log goes on


@pytest.mark.parametrize("strict", ["0", "1"])
def test_a_full_disk_names_the_device(strict, tmp_path, reference):
    with tmpfs(tmp_path / "full", "40k") as mount, fm.cell("disk full (tmpfs)", fm.SGLANG, strict=strict == "1") as t:
        config = write_config(mount)
        env = env_for(VERSION, DUMP_ON="1", MSPROBE_GENERATE_CONFIG=str(config), MSPROBE_HOOKS_STRICT=strict)
        result = scenario(env)
        t.runs += 1
        if strict == "1":
            assert result.returncode != 0 and "No space left on device" in result.stderr, result.stderr[-3000:]
            return
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.json()["outputs"] == reference
        lines = fm.our_lines(result.stderr)
        assert len(lines) == 2 and f"no space left on the device holding {mount}" in lines[0], lines
        fm.check_logs(mount, t)
