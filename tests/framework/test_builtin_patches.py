"""Every built-in patch through :class:`support.patch_case.PatchTestCase`: import/patch/unpatch in every
order, each ordering a fresh interpreter, against real verl (its Megatron engine module included) and
the vLLM, vLLM-Ascend and SGLang stand-ins. A new patch in ``msprobe_hooks.patches`` is covered here without
a line written.
"""

from __future__ import annotations

import pytest
from support.patch_case import SITES, PatchTestCase, Runs, builtin_cases

from msprobe_hooks.patches import PATCHES

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

CASES = builtin_cases()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("patch-cases"), PATCHES)


@pytest.fixture(params=CASES, ids=str)
def case(request: pytest.FixtureRequest):
    return request.param


class TestBuiltinPatches(PatchTestCase):
    pass


def test_every_builtin_patch_has_a_site() -> None:
    covered = {case.patch.name for case in CASES}
    missing = [p.name for p in PATCHES if p.name not in covered]
    assert not missing, f"no site provides the target of {missing}: add one to support.patch_case.SITES"


def test_the_cases_include_a_skipped_and_a_nothing_to_wrap_patch() -> None:
    """The two version-gated outcomes are exercised, not only described."""
    assert any(case.skipped for case in CASES)
    assert any(case.wraps_nothing for case in CASES)
    assert {case.site.name for case in CASES} == {site.name for site in SITES}
