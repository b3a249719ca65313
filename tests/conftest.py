"""Shared test helpers: fresh interpreters with a controlled environment.

Activation happens at interpreter start-up, so most tests run a child ``python`` with the shim
on PYTHONPATH and assert on what it prints (a JSON line) and on its exit status.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from msprobe_hooks.cli.launch import shim_dir

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# Variables of ours that a developer's shell may carry; every child starts without them.
_OURS = ("DUMP_", "PROMPTS_ONLY", "MSPROBE_", "TORCHDYNAMO_DISABLE")


def clean_env(**overrides: str) -> dict[str, str]:
    """The current environment without any variable of ours and without PYTHONPATH, plus overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OURS) and k != "PYTHONPATH"}
    env.update(overrides)
    return env


def shim_env(*extra_path: str | os.PathLike, **overrides: str) -> dict[str, str]:
    """A clean environment with the shim first on PYTHONPATH, then ``extra_path`` entries."""
    path = os.pathsep.join([shim_dir(), *map(str, extra_path)])
    return clean_env(PYTHONPATH=path, **overrides)


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        """The last stdout line, parsed: children report by printing one JSON object."""
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        assert lines, f"child printed nothing; stderr:\n{self.stderr}"
        return json.loads(lines[-1])


def doctor_patches(stdout: str) -> dict[str, str]:
    """``msprobe-hooks doctor``'s patch table: patch name -> what it says of that patch."""
    rows = [line.split() for line in stdout.splitlines()]
    return {words[0]: " ".join(words[1:]) for words in rows if words and "." in words[0]}


# What ``doctor --spawn-check`` says in an inference venv: every kind of child activates; no Ray there.
SPAWN_CHECKS_WITHOUT_RAY = [["spawn", "active"], ["fork", "active"], ["subprocess", "active"], ["ray", "task"]]


def spawn_checks(stdout: str) -> list[list[str]]:
    """The first two words of each line of ``doctor --spawn-check``'s spawn-check section."""
    return [line.split()[:2] for line in stdout.split("spawn check")[1].splitlines()[1:]]


def run_python(
    code: str,
    env: dict[str, str],
    *flags: str,
    cwd: str | os.PathLike | None = None,
    timeout: float = 300,
    python: str = sys.executable,
) -> Result:
    """Run ``code`` in a fresh interpreter (``python [flags] -c code``)."""
    done = subprocess.run(
        [python, *flags, "-c", textwrap.dedent(code)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Result(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def ray_tmp():
    """A private, short Ray temp folder (Ray's socket paths must stay under 107 bytes)."""
    path = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)
