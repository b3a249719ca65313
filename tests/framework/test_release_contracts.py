"""Every patch's contract holds for every supported release (facts read from the release files).

The facts come from ``contracts/releases.json``, written by ``scripts/release_contracts.py refresh``
from the wheels and sdists on PyPI; this test is the offline half, run on every commit.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from support import REPO

from msprobe_hooks.contracts import Attribute, Function, Method
from msprobe_hooks.patches import PATCHES
from msprobe_hooks.registry import Patch

_spec = importlib.util.spec_from_file_location("release_contracts", REPO / "scripts" / "release_contracts.py")
release_contracts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(release_contracts)

SNAPSHOT = json.loads(release_contracts.SNAPSHOT.read_text()) if release_contracts.SNAPSHOT.exists() else {}
PATCHES = list(PATCHES)


@pytest.mark.parametrize("patch", PATCHES, ids=[p.name for p in PATCHES])
def test_every_supported_release_satisfies_the_contract(patch):
    report = release_contracts.problems(PATCHES, SNAPSHOT)[patch.name]
    assert {version: lines for version, lines in report.items() if lines} == {}
    assert len(report) >= 1


@pytest.mark.parametrize("patch", [p for p in PATCHES if p.contract], ids=[p.name for p in PATCHES if p.contract])
def test_every_contract_item_belongs_to_the_patched_distribution(patch):
    for item in patch.contract:
        assert release_contracts.distribution_of(item.module, PATCHES) in (None, patch.distribution), item


def test_the_snapshot_holds_only_what_pypi_published():
    for dist, releases in SNAPSHOT.items():
        for version, record in releases.items():
            assert record["file"].startswith((dist.replace("-", "_"), dist)), (dist, version, record["file"])
            assert len(record["sha256"]) == 64


# The checker itself, on a small hand-made snapshot, so that a checker that passes everything fails here.

M = "pkg.runner"
FAKE = Patch(
    "test.runner",
    M,
    "impl",
    "pkg",
    ">=1.0",
    "",
    "",
    "",
    contract=(
        Method(M, "Runner.step", ("self", "batch"), versions="<2"),
        Method(M, "Runner.step", ("self", "batch", "extra"), versions=">=2"),
        Attribute(M, "Runner", "model"),
        Function(M, "helper", ("x",)),
    ),
)


def record(params: list[str], attributes: list[str], requested=("Runner.step", "Runner.model", "helper")) -> dict:
    facts = {
        "classes": {"Runner": {"methods": {"step": params}, "attributes": attributes, "bases": []}},
        "functions": {"helper": ["x"]},
        "requested": list(requested),
    }
    return {"file": "pkg-1.whl", "sha256": "0" * 64, "modules": {M: facts}}


def test_the_checker_passes_matching_releases_and_applies_version_limited_items():
    snapshot = {
        "pkg": {"1.0": record(["self", "batch"], ["model"]), "2.0": record(["self", "batch", "extra"], ["model"])}
    }
    assert release_contracts.problems([FAKE], snapshot) == {"test.runner": {"1.0": [], "2.0": []}}


def test_the_checker_names_each_drift():
    snapshot = {"pkg": {"2.0": record(["self", "micro_batch"], [])}}
    lines = release_contracts.problems([FAKE], snapshot)["test.runner"]["2.0"]
    assert len(lines) == 2
    assert "parameters are (self, micro_batch)" in lines[0]
    assert lines[1] == "pkg.runner:Runner.model: attribute never assigned"


def test_the_checker_calls_a_snapshot_that_lacks_an_asked_class_stale():
    snapshot = {"pkg": {"1.0": record(["self", "batch"], ["model"], requested=("helper",))}}
    lines = release_contracts.problems([FAKE], snapshot)["test.runner"]["1.0"]
    assert lines and all("not in the snapshot" in line for line in lines[:2])


def test_a_module_missing_from_a_release_is_a_problem():
    snapshot = {"pkg": {"1.0": {"file": "pkg-1.whl", "sha256": "0" * 64, "modules": {M: None}}}}
    lines = release_contracts.problems([FAKE], snapshot)["test.runner"]["1.0"]
    assert lines and all("module pkg.runner not found" in line for line in lines)


def test_no_release_in_range_is_a_problem():
    assert release_contracts.problems([FAKE], {"pkg": {"0.9": record([], [])}}) == {
        "test.runner": {"-": ["no release of pkg>=1.0 in the snapshot"]}
    }


def test_supported_versions_keeps_finals_and_the_newest_prerelease_of_lines_without_one():
    released = ["0.11.0rc1", "0.11.0", "0.12.0rc1", "0.12.0rc2", "0.13.0.dev0", "0.10.0", "0.11.0.post1", "junk"]
    assert release_contracts.supported_versions(released, [">=0.11"]) == [
        "0.11.0",
        "0.11.0.post1",
        "0.12.0rc2",
        "0.13.0.dev0",
    ]
