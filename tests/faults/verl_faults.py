"""Running verl 0.9.1's real FSDP2 engine with a fault injected, and the checks of its cells.

Every run is ``tests/support/verl_engine_child.py`` (actor log-prob, update, log-prob; 4 samples in
micro-batches of 2), forked from the test worker's zygote (``support.zygote``), under the shim, with the fault
site (``fault_site/sitecustomize.py``, chained by the shim) injecting the fault. The baseline (no DUMP_ON) is
made once per session (``conftest.py``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from support.verl_runs import RESULT_KEYS, EngineRun, run_engine, write_config

from . import fault_matrix as fm

# The actor alone (one engine to build, not three): a log-prob pass, an update, a log-prob pass.
SPEC = {"ops": ["actor.log_prob", "actor.update", "actor.log_prob"], "count": 4, "seed": 0, "micro_batch_size": 2}
# Both kinds of window in one run: prompt-only forwards in the log-prob passes, micro-batches in the update.
BOTH = {"DUMP_PHASE": "all", "PROMPTS_ONLY": "1"}


@dataclass(frozen=True)
class Engine:
    """One of verl's real engines as the fault cells run it (the ``engine`` fixture of ``conftest.py``)."""

    patch: str  # the patch that dumps it, named in its lines
    column: str  # its column of the matrix
    model_dir: str
    baseline: EngineRun  # the same ops without DUMP_ON
    spec: dict  # what its runs change in SPEC
    also: tuple[str, ...] = ()  # the columns its runs with PROMPTS_ONLY=1 count for too

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.column, *self.also)


def faulted(
    tmp: Path, model_dir: str, faults: str, spec: dict | None = None, world_size: int = 1, **env: str
) -> EngineRun:
    """A dumped run with ``faults`` injected; msprobe at level L1 unless ``env`` names a config.

    L1 (API hooks only): msprobe's mix-level module backward hooks shift an update by ~1e-6 (msprobe's
    own effect), L1 leaves every result bit-identical, so "unchanged" can be exact.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    spec = {**SPEC, "model_dir": model_dir, **(spec or {})}
    env.setdefault("MSPROBE_ACTOR_CONFIG", write_config(tmp / "l1.json", level="L1"))
    return run_engine(tmp, spec, world_size=world_size, path=[fm.FAULT_SITE], FAULT_INJECT=faults, **env)


def assert_unchanged(run: EngineRun, baseline: EngineRun) -> None:
    assert run.returncode == 0, run.stderr[-3000:]
    for got, want in zip(run.results(), baseline.results(), strict=True):
        for key in RESULT_KEYS:
            assert got.get(key) == want.get(key), f"{got['op']} {key} differs under the fault"


def assert_stopped(run: EngineRun, names: str) -> None:
    """The STRICT variant: the run failed, and the traceback names the fault."""
    assert run.returncode != 0, "MSPROBE_HOOKS_STRICT=1 did not raise"
    assert names in run.stderr, run.stderr[-3000:]


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``path`` (the suite runs as root, as .ci/run does)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    assert done.returncode == 0, f"cannot mount a tmpfs (the fault suite needs root): {done.stderr.decode()}"
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)
