"""The README demo, run as a user runs it: ``msprobe-hooks run -- python examples/cpu_demo.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO
from support.interpreter import clean_env

pytestmark = pytest.mark.engine  # runs a real engine (make test-fast leaves it out)


def test_demo_writes_one_prompt_dump_per_sample(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "msprobe_hooks",
        "run",
        "--",
        sys.executable,
        str(REPO / "examples" / "cpu_demo.py"),
    ]
    env = clean_env(DUMP_ON="1", PROMPTS_ONLY="1", OMP_NUM_THREADS="1")
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "DUMP_PHASE=log_prob PROMPTS_ONLY=1: 4 msprobe dumps" in done.stdout
    # The default output folder is ./msprobe_dump of the directory the job was started from.
    root = tmp_path / "msprobe_dump" / "actor"
    logs = list(root.glob("*/update_actor_log.jsonl"))
    assert len(logs) == 1 and f"log: {logs[0]}" in done.stdout
    lines = [json.loads(line) for line in logs[0].read_text().splitlines()]
    assert [(line["step"], line["dump"], line["samples"][0]["prompt_len"]) for line in lines] == [
        (0, "prompt", 5),
        (1, "prompt", 7),
        (2, "prompt", 4),
        (3, "prompt", 6),
    ]
    assert all((root / f"step{n}" / "rank0" / "dump.json").is_file() for n in range(4))
