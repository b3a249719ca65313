"""The stand-ins the vLLM tests drive satisfy every contract item of the vLLM patches.

The same items are checked against every released vLLM and vLLM-Ascend by
test_release_contracts.py, so behaviour shown on the stand-ins rests on what the releases have.
Facts are read from the stand-in sources with ast, as from a release file, nothing imported.
"""

from __future__ import annotations

import pytest
from support.vllm_standin import SITE

from msprobe_hooks import contracts
from msprobe_hooks.patches.vllm import VLLM_ASCEND_MODEL_RUNNER, VLLM_MODEL_RUNNER, VLLM_MODEL_RUNNER_V2

# The stand-ins imitate these releases (their behaviour follows the version their dist-info gives).
CASES = [
    (VLLM_MODEL_RUNNER, "0.11.0"),
    (VLLM_MODEL_RUNNER, "0.23.0"),
    (VLLM_MODEL_RUNNER_V2, "0.23.0"),
    (VLLM_ASCEND_MODEL_RUNNER, "0.12.0rc1"),
    (VLLM_ASCEND_MODEL_RUNNER, "0.30.0rc2"),
]


def standin_facts(module: str) -> contracts.ModuleFacts | None:
    for rel in contracts.module_relpaths(module):
        path = SITE / rel
        if path.is_file():
            return contracts.source_facts(str(path))
    return None


@pytest.mark.parametrize(("patch", "version"), CASES, ids=[f"{p.name}-{v}" for p, v in CASES])
def test_the_standin_satisfies_every_contract_item(patch, version):
    items = [item for item in patch.contract if contracts.applies(item, version)]
    assert items
    problems = [problem for item in items if (problem := contracts.check_facts(item, standin_facts(item.module)))]
    assert problems == []
