"""The fault suite's marker and the runs its files share (its summary, the matrix, is tests/conftest.py's: the
process that prints it, pytest-xdist's controller, runs no test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.verl_runs import MEGATRON_SPEC, EngineRun, run_engine

from cpu_kit import verl_cpu

from . import fault_matrix, verl_faults


def pytest_collection_modifyitems(items) -> None:
    """Every cell runs real engines or fresh interpreters: an engine tier (make test-fast leaves it out)."""
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.engine)


# --- the runs several test files of the suite share ---------------------------------------------


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny Qwen2 that verl's FSDP2 engine trains in the fault runs."""
    return verl_cpu.build_model_dir(str(tmp_path_factory.mktemp("model")))


@pytest.fixture(scope="session")
def baseline(tmp_path_factory: pytest.TempPathFactory, model_dir: str) -> EngineRun:
    """The fault runs' operations without DUMP_ON: what every surviving run must reproduce exactly."""
    run = run_engine(tmp_path_factory.mktemp("baseline"), {**verl_faults.SPEC, "model_dir": model_dir}, dump=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.fixture(params=["fsdp", "megatron"])
def engine(request: pytest.FixtureRequest) -> verl_faults.Engine:
    """verl's FSDP2 engine (its cells count for the prompts-only column too) or its Megatron engine; the
    Megatron baseline is the real tier's (tests/conftest.py), made once for the session."""
    if request.param == "fsdp":
        model_dir, baseline = request.getfixturevalue("model_dir"), request.getfixturevalue("baseline")
        also = (fault_matrix.PROMPTS_ONLY,)
        return verl_faults.Engine("verl.fsdp_engine", fault_matrix.VERL_FSDP, model_dir, baseline, {}, also)
    model_dir, baseline = request.getfixturevalue("megatron_model_dir"), request.getfixturevalue("megatron_baseline")
    return verl_faults.Engine("verl.megatron_engine", fault_matrix.VERL_MEGATRON, model_dir, baseline, MEGATRON_SPEC)
