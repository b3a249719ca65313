"""The SGLang stand-ins hold what the patches' contracts ask of each release, and lack what it lacks.

The contracts themselves are checked against the released SGLang wheels by
``scripts/release_contracts.py``; this makes sure the behaviour tests run against stand-ins that
look like those releases where the patches look.
"""

from __future__ import annotations

import pytest
from support.sglang_standin import FAMILIES, standin_facts

from msprobe_hooks import contracts
from msprobe_hooks.contracts import Attribute
from msprobe_hooks.patches import PATCHES
from msprobe_hooks.patches.sglang import GRAPH_SWITCHES

SGLANG = [p for p in PATCHES if p.distribution == "sglang"]

# Contract items that the real release of each stand-in's version lacks (read from the wheels), and
# that decide which way the patches go: the stand-in must lack them too.
ABSENT = {
    "0.5.2": [
        "sglang.srt.managers.schedule_batch:ModelWorkerBatch.reqs",
        "sglang.srt.model_executor.forward_batch_info:ForwardBatch.rids",
        "sglang.srt.model_executor.model_runner:ModelRunner.msprobe_debugger",
    ],
    "0.5.10": ["sglang.srt.model_executor.model_runner:ModelRunner.msprobe_debugger"],
    "0.5.11": [],
    "0.5.23": [
        "sglang.srt.managers.schedule_batch:ModelWorkerBatch.reqs",
        "sglang.srt.managers.schedule_batch:ScheduleBatch.get_model_worker_batch(self, ...)",
        "sglang.srt.model_executor.model_runner:ModelRunner.dp_size",
    ],
}


def _items():
    for patch in SGLANG:
        yield from patch.contract


@pytest.mark.parametrize("version", sorted(FAMILIES))
def test_standin_meets_every_contract_item_of_its_version(version):
    problems = [
        problem
        for item in _items()
        if contracts.applies(item, version)
        and (problem := contracts.check_facts(item, standin_facts(version, item.module)))
    ]
    assert problems == []


@pytest.mark.parametrize("version", sorted(FAMILIES))
def test_standin_lacks_what_its_release_lacks(version):
    by_name = {item.describe(): item for item in _items()}
    for name in ABSENT[version]:
        item = by_name[name]
        assert not contracts.applies(item, version)
        assert contracts.check_facts(item, standin_facts(version, item.module)) is not None, name


def test_standin_versions_are_the_dist_info_versions():
    for version, root in FAMILIES.items():
        assert (root / f"sglang-{version}.dist-info" / "METADATA").read_text().count(f"Version: {version}\n") == 1
        assert contracts.version_supported(version, SGLANG[0].versions)


def test_every_graph_switch_read_is_in_the_contract():
    declared = {
        (item.name, item.versions) for item in _items() if isinstance(item, Attribute) and item.qualname == "ServerArgs"
    }
    assert {(field, versions) for versions, field, _, _ in GRAPH_SWITCHES} <= declared
