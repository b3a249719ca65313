"""verl 0.9.1's own CPU tests, from its PyPI sdist (``make verl-tests``), pass with ``DUMP_ON=1``.

They drive the code our patches wrap (the agent loop's postprocessing and output records, the
rollout client, the FSDP engine module, the trainer's metrics) in ways our own tests do not:
stand-in objects, methods called through their class, records built by hand. With the hooks on
(shim active, every patch applied) they must pass as they do without.

The sdist does not ship the FSDP engine's CPU tests named in issue 10 (verl's repository has them);
``test_verl_fsdp_engine.py`` drives ``forward_backward_batch`` the way they do.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO
from support.interpreter import shim_env

pytestmark = pytest.mark.engine  # runs a real engine (make test-fast leaves it out)

VERL_TESTS = REPO / "build" / "verl-tests"
FILES = [
    "tests/experimental/agent_loop/test_agent_loop_extra_fields_schema_on_cpu.py",
    "tests/experimental/agent_loop/test_tool_call_id_on_cpu.py",
    "tests/experimental/agent_loop/test_multimodal_position_ids_on_cpu.py",
    "tests/experimental/agent_loop/test_call_tool_on_cpu.py",
    "tests/trainer/ppo/test_spec_decode_metrics_on_cpu.py",
]
# Patches whose targets these files import: each must really be applied, or the run proves nothing.
EXPECTED_PATCHES = {"verl.request_id_agent_loop", "verl.request_id_llm_server", "verl.fsdp_engine"}


def test_verl_s_own_cpu_tests_pass_with_dump_on(tmp_path: Path) -> None:
    assert (VERL_TESTS / "pytest.ini").is_file(), f"{VERL_TESTS} is missing: run `make verl-tests`"
    env = shim_env(
        VERL_TESTS / "site",
        DUMP_ON="1",
        DUMP_PHASE="all",
        PROMPTS_ONLY="1",
        MSPROBE_HOOKS_OUTPUT_DIR=str(tmp_path / "dumps"),
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *FILES],
        cwd=VERL_TESTS,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert re.search(r"\b\d+ passed\b", done.stdout) and " failed" not in done.stdout, done.stdout[-2000:]
    assert set(re.findall(r"applied patch (\S+)", output)) >= EXPECTED_PATCHES, output[-4000:]
    assert "the host goes on unaffected" not in output
