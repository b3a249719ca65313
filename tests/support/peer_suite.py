"""An engine's own test suite run twice, with the hooks off and on, compared test by test (dd-trace-py's way).

Each pass is one ``pytest`` per test file in the engine's venv, in the suite's own folder (its conftest and pytest
options), with a JUnit XML report; outcomes are read per test id. The "on" pass is the user's set-up: the shim
first on PYTHONPATH, ``DUMP_ON=1``, an msprobe config for the inference side, a dump root. Equal outcomes prove
nothing unless the hooks ran, so the caller also checks what the "on" pass left: the patches it applied and the
engines' dispatch logs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from support.interpreter import clean_env, shim_env

PASSED, FAILED, ERROR, SKIPPED = "passed", "failed", "error", "skipped"


@dataclass(frozen=True)
class Pass:
    """One pytest run of the suite: its outcome per test id and what it printed."""

    outcomes: dict[str, str]
    output: str
    returncode: int

    def counts(self) -> Counter[str]:
        return Counter(self.outcomes.values())

    def applied_patches(self) -> set[str]:
        return set(re.findall(r"applied patch (\S+)", self.output))

    @classmethod
    def merged(cls, passes: Sequence[Pass]) -> Pass:
        outcomes = {test_id: outcome for one in passes for test_id, outcome in one.outcomes.items()}
        return cls(outcomes, "".join(one.output for one in passes), max(one.returncode for one in passes))


def outcomes(junit: Path) -> dict[str, str]:
    """``{classname::name: outcome}`` of a JUnit XML report (pytest's ``--junitxml``)."""
    found = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        found[test_id] = (
            FAILED if "failure" in kinds else ERROR if "error" in kinds else SKIPPED if "skipped" in kinds else PASSED
        )
    return found


def run_pass(
    python: str | os.PathLike,
    suite: Path,
    files: Sequence[str],
    env: Mapping[str, str],
    junit: Path,
    timeout: float,
) -> Pass:
    command = [os.fspath(python), "-m", "pytest", "-p", "no:cacheprovider", "-rN", "-s", f"--junitxml={junit}", *files]
    # A session of its own: a hung engine's processes are killed with the pass.
    with subprocess.Popen(
        command, cwd=suite, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    ) as process:  # fmt: skip
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            raise AssertionError(f"the pass outlived {timeout} s, killed:\n{output[-4000:]}") from None
    assert junit.is_file(), f"pytest wrote no report (exit {process.returncode}):\n{output[-4000:]}"
    return Pass(outcomes(junit), output, process.returncode)


@dataclass(frozen=True)
class OffOn:
    off: Pass
    on: Pass

    def differences(self) -> dict[str, tuple[str | None, str | None]]:
        """Test ids whose outcome differs (or that ran in one pass only): ``{id: (off, on)}``."""
        ids = self.off.outcomes.keys() | self.on.outcomes.keys()
        return {
            test_id: (self.off.outcomes.get(test_id), self.on.outcomes.get(test_id))
            for test_id in sorted(ids)
            if self.off.outcomes.get(test_id) != self.on.outcomes.get(test_id)
        }


def off_and_on(
    python: str | os.PathLike,
    suite: Path,
    selections: Sequence[Sequence[str]],
    work: Path,
    *,
    path: Sequence[str | os.PathLike] = (),
    variables: Mapping[str, str] | None = None,
    hooks: Mapping[str, str] | None = None,
    timeout: float = 420,
) -> OffOn:
    """Each of ``selections`` (a test file and its pytest options) without the hooks, then with them (``hooks``: the
    "on" pass's variables of ours), a pytest process each: a file's engines and globals never meet another's, as in
    the engine's own CI (one of vLLM's runner tests left state that broke a later file's engine start).

    ``path``: PYTHONPATH entries both passes need (the test dependencies beside the suite); ``variables``: what
    both passes need (offline hub, CPU device). Dumps go under ``work/dumps``; ``timeout``: seconds a pass may take."""
    work.mkdir(parents=True, exist_ok=True)
    common = dict(variables or {})
    off_env = clean_env(**common, PYTHONPATH=os.pathsep.join(map(os.fspath, path)))
    on_env = shim_env(*path, **common, MSPROBE_HOOKS_OUTPUT_DIR=os.fspath(work / "dumps"), **(hooks or {}))
    off, on = [], []
    for number, selection in enumerate(selections):
        off.append(run_pass(python, suite, selection, off_env, work / f"off-{number}.xml", timeout))
        on.append(run_pass(python, suite, selection, on_env, work / f"on-{number}.xml", timeout))
    return OffOn(Pass.merged(off), Pass.merged(on))
