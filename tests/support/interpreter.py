"""Fresh interpreters with a controlled environment.

Activation happens at interpreter start-up, so most tests run a child ``python`` with the shim
on PYTHONPATH and assert on what it prints (a JSON line) and on its exit status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

from msprobe_hooks.cli.launch import shim_dir

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
