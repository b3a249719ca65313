"""Fixtures and hooks only; the helpers the tests share are in ``tests/support/``."""

from __future__ import annotations

import shutil
import tempfile

import pytest


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
