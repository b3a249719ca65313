"""Fixtures and hooks only; the helpers the tests share are in ``tests/support/``.

``make test`` runs the suite in two pytest-xdist workers, a file to a worker (``--dist loadfile``: a module's
engine runs are made once; ``--no-loadscope-reorder``, else xdist hands out the files with the most tests first and
the longest engine files end the run on one worker). The files are handed out longest first: the measured longest
(``LONGEST_FIRST``), the other engine files, the fresh-interpreter ones, then the in-process tests filling the end
of the run; a test marked ``alone`` (the real-size model) runs with no other engine test beside it.
"""

from __future__ import annotations

import fcntl
import logging
import shutil
import tempfile
from pathlib import Path

import pytest
from faults import fault_matrix

from msprobe_hooks.log import NAME as LOGGER

# Locked by every engine test, shared, and exclusively by an ``alone`` one: one file for the machine, so that the
# workers of a session (and any other session here) see the same lock.
ENGINE_LOCK = Path(tempfile.gettempdir()) / "msprobe-hooks-tests-engines.lock"


# The longest files of make test, longest first (pytest --durations=0 in a fresh clone, summed per file; list one
# here when it takes minutes): two workers end together when the longest start first.
LONGEST_FIRST = (
    "inference/test_demo.py",
    "faults/test_verl_engine.py",
    "inference/test_real_rl_loop.py",
    "inference/test_real_causes.py",
    "faults/test_ray_worker_lost.py",
    "faults/test_vllm_own_suite.py",
    "inference/test_real_vllm.py",
    "training/test_real_megatron.py",
    "training/test_trainer_patches_under_shim.py",
    "analysis/test_compare.py",
    "analysis/test_tp_real.py",
    "analysis/test_compare_moe.py",
    "analysis/test_compare_sglang.py",
    "inference/test_sglang_runner.py",
    "training/test_verl_fsdp_engine.py",
    "faults/test_vllm_and_analysis.py",
    "inference/test_real_sglang.py",
)
TESTS = Path(__file__).parent


@pytest.hookimpl(trylast=True)  # after tests/faults/conftest.py marks its files
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A stable sort by file: LONGEST_FIRST in its order, the other engine files, the fresh-interpreter files, the
    in-process ones (each group in collection order)."""
    engine_files = {item.path for item in items if item.get_closest_marker("engine")}
    interpreter_files = {item.path for item in items if item.get_closest_marker("interpreter")}

    def rank(item: pytest.Item) -> tuple[int, int]:
        name = item.path.relative_to(TESTS).as_posix()
        if name in LONGEST_FIRST:
            return 0, LONGEST_FIRST.index(name)
        return (1 if item.path in engine_files else 2 if item.path in interpreter_files else 3), 0

    items.sort(key=rank)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item):
    """An engine test (its setup and teardown, where module fixtures start and stop engines, included) holds the
    session's engine lock: shared, or exclusive when marked ``alone``."""
    if not item.get_closest_marker("engine"):
        return (yield)
    with open(ENGINE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if item.get_closest_marker("alone") else fcntl.LOCK_SH)
        try:
            return (yield)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A worker hands its fault-matrix cells to the controller."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["fault_matrix"] = fault_matrix.exported()


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: the controller, as each worker ends
def pytest_testnodedown(node, error) -> None:  # noqa: ANN001
    fault_matrix.merge(node.workeroutput.get("fault_matrix", []))


def pytest_terminal_summary(terminalreporter) -> None:
    """The fault matrix, and docs/reliability.md written when the whole matrix ran (a partial selection prints what
    ran and leaves the file alone)."""
    if not fault_matrix.RESULTS:
        return
    terminalreporter.section("fault matrix (tests/faults)")
    terminalreporter.write_line(fault_matrix.table())
    if fault_matrix.ran_whole():
        fault_matrix.write_doc()
        terminalreporter.write_line(f"written to {fault_matrix.RELIABILITY_DOC}")
    else:
        where = fault_matrix.RELIABILITY_DOC
        terminalreporter.write_line(f"not the whole matrix (or a cell failed): {where} left as it is")


@pytest.fixture
def hook_warnings(caplog):
    """The hooks' warnings, read when called (their logger does not propagate: its handler is swapped for caplog's)."""
    logger = logging.getLogger(LOGGER)
    saved = logger.handlers[:], logger.propagate, logger.level
    logger.handlers, logger.propagate = [caplog.handler], False
    logger.setLevel(logging.INFO)
    yield lambda: [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    logger.handlers, logger.propagate, _ = saved
    logger.setLevel(saved[2])


@pytest.fixture
def ray_tmp():
    """A private, short Ray temp folder (Ray's socket paths must stay under 107 bytes)."""
    path = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


# --- verl's real Megatron engine: shared by its tier (tests/training) and the fault suite -------
# Imported when first used: torch and verl stay out of sessions that need no engine.


@pytest.fixture(scope="session")
def megatron_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny Qwen2 of ``cpu_kit.verl_cpu``, which mbridge loads into the Megatron engine."""
    from cpu_kit import verl_cpu

    return verl_cpu.build_model_dir(str(tmp_path_factory.mktemp("megatron-model")))


@pytest.fixture(scope="session")
def megatron_baseline(tmp_path_factory: pytest.TempPathFactory, megatron_model_dir: str):
    """``verl_runs.MEGATRON_SPEC`` at world size 1 without DUMP_ON: what every dumped run of it must reproduce
    exactly (an ``EngineRun``)."""
    from support.verl_runs import MEGATRON_SPEC, run_engine

    spec = {**MEGATRON_SPEC, "model_dir": megatron_model_dir}
    run = run_engine(tmp_path_factory.mktemp("megatron-baseline"), spec, dump=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return run
