"""The verdict decided once, by the rules handed in (``answer.verdict.judge``), on golden pairs.

Comparing measures (errors, the routers' flips and margins) and decides nothing; ``judge`` names a pair's
first divergence by the rules it is given, in their order: a custom list changes the verdict, and routing
names the divergence only as one of those rules.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import golden

from msprobe_hooks.analysis.answer.verdict import FixedRule, RoutingRule, StepRule, judge, rules
from msprobe_hooks.analysis.comparing.compare import compare_pair
from msprobe_hooks.analysis.one_pair import judged_pair
from msprobe_hooks.analysis.pairing import pairs
from msprobe_hooks.analysis.results import DEFAULT_THRESHOLD, FirstRule, Mode, ModuleRow, PairKind, PairResult, Verdict
from msprobe_hooks.cli import main

VERDICT, MOE = golden.GOLDEN / "verdict", golden.GOLDEN / "moe"
UP = "layers.1.mlp.gate_up_proj"  # scaled by 3 % in verdict/fp32-up_proj-1.03: the fixed threshold names a later row


def aligned(tmp_path: Path, train: Path, generate: Path) -> list[pairs.Pair]:
    found = tmp_path / "pairs.jsonl"
    assert main(["align", str(train), str(generate), "-o", str(found)]) == 0
    return list(pairs.read(str(found)))


def judged(found: list[pairs.Pair], by: tuple) -> list[tuple[PairResult, list[ModuleRow]]]:
    return [judged_pair(i, pair, by) for i, pair in enumerate(found)]


def test_comparing_measures_and_judge_decides(tmp_path):
    (pair, *_) = aligned(tmp_path, VERDICT / "actor", VERDICT / "fp32-up_proj-1.03" / "generate")
    result, rows = compare_pair(0, pair)
    assert result.compared and result.max_error is not None and result.mode is Mode.STATISTICS
    assert result.first_rule is None and result.first_layer is None and not result.first_module
    assert all(r.diverges is None and r.steps_up is None for r in rows)
    judge(result, rows, rules(DEFAULT_THRESHOLD))
    assert result.verdict is Verdict.DIVERGES and result.first_rule is FirstRule.STEP
    assert (result.first_module, result.first_layer) == (UP, 1)
    assert any(r.steps_up for r in rows) and all(r.diverges is not None for r in rows if r.error is not None)


def test_the_rules_handed_in_are_the_ones_used(tmp_path):
    found = aligned(tmp_path, VERDICT / "actor", VERDICT / "fp32-up_proj-1.03" / "generate")
    default = judged(found, rules(DEFAULT_THRESHOLD))
    assert {(r.first_rule, r.first_module) for r, _ in default} == {(FirstRule.STEP, UP)}
    threshold_only = judged(found, (FixedRule(DEFAULT_THRESHOLD),))
    assert {r.first_rule for r, _ in threshold_only} == {FirstRule.THRESHOLD}
    assert any(r.first_module != UP for r, _ in threshold_only)  # the fixed threshold misplaces it
    assert all(row.steps_up is None for _, rows in threshold_only for row in rows)  # no step rule ran
    # A step rule that asks for a step no error makes, and a threshold no error crosses: nothing diverges.
    blind = judged(found, (StepRule(factor=1e9), FixedRule(1e9)))
    assert {r.verdict for r, _ in blind} == {Verdict.NO_DIVERGENCE}
    assert {r.first_rule for r, _ in blind} == {None}


def test_routing_is_one_of_the_rules(tmp_path):
    fault = json.loads((MOE / "router_fault.json").read_text())
    found = aligned(tmp_path, MOE / "actor", MOE / "router" / "generate")
    with_routing = judged(found, rules(DEFAULT_THRESHOLD))
    named = [r for r, _ in with_routing if r.first_rule is FirstRule.ROUTING]
    assert named and all(r.first_io == "routing" and r.first_layer == r.routing_layer for r in named)
    assert all(r.first_module == f"layers.{r.first_layer}.mlp.gate" for r in named)
    assert {r.first_layer for r in named} == {fault["layer"]}
    without = judged(found, (StepRule(), FixedRule(DEFAULT_THRESHOLD)))
    assert not [r for r, _ in without if r.first_rule is FirstRule.ROUTING]
    # The flips are comparing's facts, there without the rule; the noise is the rule's to decide.
    layers = [layer for r, _ in without for layer in r.routing if layer.flipped]
    assert layers and all(layer.noise is None and layer.beyond_noise is None for layer in layers)


def test_routing_decides_the_noise_from_the_step_rules_floor(tmp_path):
    found = aligned(tmp_path, MOE / "actor", MOE / "bf16" / "generate")
    default = judged(found, rules(DEFAULT_THRESHOLD))
    wide = judged(found, (StepRule(), FixedRule(DEFAULT_THRESHOLD), RoutingRule(StepRule(minimum=1.0))))
    noise = {layer.noise for r, _ in default for layer in r.routing if layer.noise is not None}
    assert noise and max(noise) < 1.0
    assert {layer.noise for r, _ in wide for layer in r.routing if layer.noise is not None} == {1.0}


def test_a_pair_kind_is_read_as_its_enum_and_an_unknown_one_is_refused_with_its_line(tmp_path):
    (pair, *_) = aligned(tmp_path, VERDICT / "actor", VERDICT / "fp32-clean" / "generate")
    assert pair.kind is PairKind.PREFILL
    line = json.loads((tmp_path / "pairs.jsonl").read_text().splitlines()[0])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**line, "kind": "prefil"}) + "\n")
    with pytest.raises(pairs.PairsFileError, match=r"bad.jsonl:1: kind 'prefil'; accepted: prefill, decode"):
        list(pairs.read(str(bad)))
