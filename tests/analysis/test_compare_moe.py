"""Qwen3-MoE and Qwen3 on the real engines: verl's FSDP2 engine against vLLM's CPU engine, the routers compared.

The MoE model (``cpu_kit/moe_inputs.py``: 3 layers of 8 experts, top 2) and four prompts (52 tokens), both sides
dumping statistics with no routing switch, as a user dumps: verl's FSDP2 engine its prompt-only forwards (its
process writes the ids and margins its routers returned into ``routed_experts.jsonl``), vLLM the steps the hooks
drive (each worker writes the ids its routers chose into its own), at tensor parallel 2 on the clean model and at 1
on a copy whose layer-1 router row was scaled so that a known share of the tokens goes to other experts; SGLang's CPU
engine on that copy too, dumping statistics through its own switch (its scheduler writes what each ``TopK`` module
chose in every dumped forward, with no switch of ours). (The tensor-mode path, the routers' ids read from the
training dump, is proven on the golden ``moe`` trees.) The dense
Qwen3 runs once, against a copy with ``layers.1.self_attn.k_norm`` x1.05 (routing switched on: there is nothing to
record). Each compare runs through the CLI, as a user does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas
import pytest
from support.compare_runs import align, msprobe_config, run_compare, run_sglang, run_training, run_vllm

from cpu_kit import moe_inputs
from msprobe_hooks.analysis.report.routing import ROUTING_CSV
from msprobe_hooks.analysis.results import FirstRule, Verdict
from msprobe_hooks.join_keys import ROUTED_EXPERTS_LOG

pytestmark = pytest.mark.engine  # runs real engines (make test-fast leaves it out)

ROUTING = {"MSPROBE_HOOKS_ROUTING": "1"}


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare-moe")
    prompts = moe_inputs.write_prompts(root / "prompts.jsonl")
    model = Path(moe_inputs.build_qwen3_moe_dir(str(root / "moe")))
    fault = moe_inputs.plant_router_fault(model, root / "moe-router", moe_inputs.read_prompt_ids(prompts))
    stats = msprobe_config(root / "statistics.json")
    return root, model, prompts, fault, stats, run_training(root / "train", model, prompts, stats)


def _pairs(moe, name: str, model: Path, tp: int) -> Path:
    root, _, prompts, _, stats, train_root = moe
    generate_root = run_vllm(root / name, model, prompts, stats, tp=tp)
    pairs = align(train_root, generate_root, root / name / "pairs.jsonl")
    assert sorted(p["key"] for p in pairs) == [f"req-{i}" for i in range(len(moe_inputs.PROMPT_LENS))]
    return root / name / "pairs.jsonl"


def test_tp2_clean_fp32_names_nothing_and_both_ranks_route_alike(moe, tmp_path):
    pairs_file = _pairs(moe, "tp2", moe[1], tp=2)
    done, results, _ = run_compare(pairs_file, tmp_path / "report")
    assert list(results["verdict"]) == [Verdict.NO_DIVERGENCE] * 4
    assert list(results["unmatched"]) == [0] * 4  # sharded linears are not comparable, no MoE module unmatched
    assert list(results["routing_flipped"]) == [0] * 4
    assert list(results["routing_layers"]) == [moe_inputs.MOE_LAYERS] * 4
    assert "routing agrees" in done.stdout
    (train_log,) = moe[5].glob(f"*/{ROUTED_EXPERTS_LOG}")  # the training side's ids came from its own record
    assert len(train_log.read_text().splitlines()) == len(moe_inputs.PROMPT_LENS)  # one per prompt-only window
    # each tensor-parallel worker captured its routers; the router is replicated, so the choices are equal
    logs = sorted((pairs_file.parent / "generate").glob(f"*/{ROUTED_EXPERTS_LOG}"))
    assert len(logs) == 2
    by_rank = [
        {(r["step"], r["rank"]): r["layers"] for r in map(json.loads, log.read_text().splitlines())} for log in logs
    ]
    (rank0, rank1) = sorted(by_rank, key=lambda lines: next(iter(lines))[1])
    assert {rank for _, rank in rank0} == {0} and {rank for _, rank in rank1} == {1}
    assert [layers for _, layers in sorted(rank0.items())] == [layers for _, layers in sorted(rank1.items())]


def test_a_planted_router_fault_is_named_routing_with_its_share(moe, tmp_path):
    root, _, _, fault, _, _ = moe
    assert fault.layer == moe_inputs.ROUTER_LAYER and abs(fault.share - moe_inputs.ROUTER_SHARE) <= 0.02
    done, results, rows = run_compare(_pairs(moe, "router", root / "moe-router", tp=1), tmp_path / "report")
    table = pandas.read_csv(tmp_path / "report" / ROUTING_CSV)
    by_layer = table.groupby("layer")[["tokens", "flipped"]].sum()
    assert by_layer.loc[0, "flipped"] == 0
    found = by_layer.loc[fault.layer, "flipped"] / by_layer.loc[fault.layer, "tokens"]
    assert abs(found - fault.share) <= 0.03  # fp32 on both sides: exactly the planted tokens
    assert done.stdout.splitlines()[0].startswith("cause: routing")
    headline = done.stdout.splitlines()[1]
    assert f"first divergence: routing diverges at layer {fault.layer}" in headline
    named = results[results["first_rule"] == FirstRule.ROUTING]
    assert len(named) >= 3 and set(named["first_module"]) == {f"layers.{fault.layer}.mlp.gate"}
    for pair in named["pair"]:  # no numeric module blamed before the router's output of that layer
        mine = rows[rows["pair"] == pair]
        router = mine[(mine["module"] == f"layers.{fault.layer}.mlp.gate") & (mine["io"] == "output")]
        before = mine[mine["order"] < router["order"].iloc[0]]
        assert not before["steps_up"].fillna(False).any() and not before["diverges"].fillna(False).any()


def test_sglang_records_its_routers_in_statistics_mode_and_the_router_fault_is_named(moe, tmp_path):
    root, _, prompts, fault, stats, train_root = moe
    generate_root = run_sglang(root / "sglang-router", root / "moe-router", prompts, stats)
    pairs = align(train_root, generate_root, root / "sglang-router" / "pairs.jsonl")
    assert sorted(p["key"] for p in pairs) == [f"req-{i}" for i in range(len(moe_inputs.PROMPT_LENS))]
    (log,) = generate_root.glob(f"*/{ROUTED_EXPERTS_LOG}")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    # SGLang's switch dumps every forward, decodes too: a line each, its rows the forward's tokens in packed order,
    # every MoE layer's ids and margins (from the router's logits TopK returns)
    assert len(lines) > len(pairs) and {line["dumped"] for line in lines} == {True}
    for line in lines:
        assert line["tokens"] == sum(row["tokens"] for row in line["requests"])
        assert set(line["layers"]) == set(line["margins"]) == {str(n) for n in range(moe_inputs.MOE_LAYERS)}
    done, results, _ = run_compare(root / "sglang-router" / "pairs.jsonl", tmp_path / "report")
    table = pandas.read_csv(tmp_path / "report" / ROUTING_CSV)
    by_layer = table.groupby("layer")[["tokens", "flipped"]].sum()
    assert by_layer.loc[0, "flipped"] == 0
    found = by_layer.loc[fault.layer, "flipped"] / by_layer.loc[fault.layer, "tokens"]
    assert abs(found - fault.share) <= 0.03  # fp32 on both sides: the planted tokens
    assert done.stdout.splitlines()[0].startswith("cause: routing"), done.stdout


def test_qwen3_a_k_norm_fault_is_named_at_the_k_norm(tmp_path_factory, tmp_path):
    root = tmp_path_factory.mktemp("compare-qwen3")
    prompts = moe_inputs.write_prompts(root / "prompts.jsonl")
    model = Path(moe_inputs.build_qwen3_dir(str(root / "qwen3")))
    faulty = moe_inputs.perturb_weight(model, root / "k_norm", *moe_inputs.QWEN3_NUMERIC_FAULT)
    stats = msprobe_config(root / "statistics.json")
    train_root = run_training(root / "train", model, prompts, stats)
    generate_root = run_vllm(root / "k_norm-run", faulty, prompts, stats, **ROUTING)
    # a dense model has no router to record: one line says so, and no routed_experts.jsonl is written
    assert not list(generate_root.glob(f"*/{ROUTED_EXPERTS_LOG}"))
    said = (root / "k_norm-run" / "vllm.log").read_text()
    assert "MSPROBE_HOOKS_ROUTING is set but this model has no MoE router" in said
    pairs_file = root / "pairs.jsonl"
    align(train_root, generate_root, pairs_file)
    done, results, rows = run_compare(pairs_file, tmp_path / "report")
    assert list(results["first_module"]) == ["layers.1.self_attn.k_norm"] * 4
    assert list(results["unmatched"]) == [0] * 4
    assert results["first_error"].between(0.04, 0.05).all()
    # before it, the q/k norms of layer 0 agree as in fp32
    early = rows[rows["module"].isin(["layers.0.self_attn.q_norm", "layers.0.self_attn.k_norm"])]
    assert len(early) == 4 * 4 and early["error"].max() < 1e-5
