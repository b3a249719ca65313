"""The CPU kit's ``main_ppo`` launcher, the parts its real runs (``test_demo.py``) cannot show failing: what the Ray
cluster started apart inherits, and that a run's leftovers are killed even when they left its process group."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cpu_kit import main_ppo
from msprobe_hooks.config import SHIM_PACKAGE

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

SHIM = f"/opt/site/{SHIM_PACKAGE}"


def test_the_cluster_started_apart_has_the_jobs_environment_without_the_hooks() -> None:
    job = {
        "PYTHONPATH": os.pathsep.join([SHIM, "/repo"]),
        "DUMP_ON": "1",
        "MSPROBE_GENERATE_CONFIG": "/c.json",
        "MSPROBE_HOOKS_OUTPUT_DIR": "/d",
        "VLLM_TARGET_DEVICE": "cpu",
        "VERL_USE_EXTERNAL_MODULES": main_ppo.PLUGIN,
    }
    cluster = main_ppo.cluster_environment(job)
    assert cluster == {
        "PYTHONPATH": "/repo",  # the kit's plugin still importable, the shim gone
        "VLLM_TARGET_DEVICE": "cpu",
        "VERL_USE_EXTERNAL_MODULES": main_ppo.PLUGIN,
        "RAY_AUTH_MODE": "disabled",
    }
    facts = main_ppo.cluster_facts("127.0.0.1:1", cluster)
    assert facts["hooks_variables"] == [] and facts["PYTHONPATH"] == "/repo"
    assert main_ppo.cluster_facts("127.0.0.1:1", job)["hooks_variables"] == [
        "DUMP_ON",
        "MSPROBE_GENERATE_CONFIG",
        "MSPROBE_HOOKS_OUTPUT_DIR",
    ]


# A session leader whose child moves to a process group of its own, as Ray's workers do, and then waits.
LEADER = """
import os, subprocess, sys
WAITS = "import os, sys; os.setpgid(0, 0); print(os.getpid(), flush=True); sys.stdin.read()"
child = subprocess.Popen([sys.executable, "-c", WAITS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
child.wait()
"""


def test_killing_a_runs_session_reaches_a_process_that_left_its_group() -> None:
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(leader.stdout.readline())
    assert os.getpgid(child) == child != leader.pid  # out of the leader's group: killpg would miss it
    main_ppo.kill_session(leader.pid)
    leader.wait()
    assert main_ppo._live_session(child) is None  # killed (a zombie at most, until its parent's parent reaps it)
    assert main_ppo._live_session(leader.pid) is None
