"""``recipe`` prints the preflight rules' own tables of wanted values, for the layout asked for."""

from __future__ import annotations

import pytest

from msprobe_hooks import preflight
from msprobe_hooks.preflight import recipe

LAYOUTS = [
    ("fsdp", {}),
    ("megatron", {"tensor_parallel": 2, "expert_parallel": 2}),
]


def _values(built: recipe.Recipe) -> dict[str, str]:
    return dict(override.lstrip("+").split("=", 1) for override in built.overrides)


@pytest.mark.parametrize(("backend", "sizes"), LAYOUTS, ids=[b for b, _ in LAYOUTS])
def test_every_table_rule_of_the_layout_is_in_the_recipe_with_its_value(backend, sizes):
    built = recipe.build(backend, 4, nnodes=2, rollout="vllm", verl_version="0.9.1", **sizes)
    values = _values(built)
    megatron = {
        "tensor_model_parallel_size": sizes.get("tensor_parallel", 1),
        "pipeline_model_parallel_size": 1,
        "expert_model_parallel_size": sizes.get("expert_parallel", 1),
    }
    layout = preflight.Layout(backend, 8, megatron if backend == "megatron" else {})
    tables = [rule for rule in preflight.RULES if rule.wanted is not None and rule.about(backend) and rule.in_recipe]
    assert {"batch-size", "rollout-n", "sequence-parallel", "rollout-skip"} <= {rule.name for rule in tables}
    for rule in tables:
        for key, value in rule.wanted(layout).items():
            if key in preflight.SKIP_KEYS and key not in recipe.skip_switches("0.9.1"):
                assert key not in values, key
            else:
                assert values[key] == preflight.hydra_value(value), (rule.name, key)
    assert values["actor_rollout_ref.rollout.n"] == str(layout.data_parallel)


def test_a_rule_left_out_of_the_recipe_prints_nothing_of_its_own():
    values = _values(recipe.build("megatron", 8, rollout="vllm", verl_version="0.9.1"))
    (left_out,) = [rule for rule in preflight.RULES if rule.wanted is not None and not rule.in_recipe]
    assert not set(left_out.wanted(preflight.Layout("megatron", 8))) & set(values)


def test_the_recipe_exports_what_the_torchdynamo_rule_wants():
    assert recipe.build("fsdp", 1, rollout="vllm-ascend").environ == preflight.TORCHDYNAMO_EXPORT
    assert preflight.TORCHDYNAMO_EXPORT == {"TORCHDYNAMO_DISABLE": "1"}
