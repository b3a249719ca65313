"""Qwen3 and Qwen3-MoE on the golden trees (real dumps, cut once): the q/k norms, the MoE block, the routers' choices.

``tests/golden/qwen3`` and ``tests/golden/moe`` hold real dumps of verl's FSDP2 engine, vLLM's CPU engine (its
``routed_experts.jsonl``) and SGLang's, on two prompts (10 tokens), each side's routers' record written by the hooks;
``scripts/make_golden.py`` says how they were made, ``moe/router_fault.json`` what the router fault planted.
No engine starts here; ``tests/analysis/test_compare_moe.py`` runs the engines.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pandas
import pytest
from support import golden
from support.pages import assert_answer_first, offline

from msprobe_hooks.analysis.comparing import names, routing
from msprobe_hooks.analysis.report import routing as report_routing
from msprobe_hooks.analysis.report.routing import ROUTING_CSV
from msprobe_hooks.analysis.results import ROUTING_COLUMNS, FirstRule, Status, Verdict
from msprobe_hooks.analysis.run import CompareOptions, compare_file
from msprobe_hooks.cli import main

QWEN3, MOE = golden.GOLDEN / "qwen3", golden.GOLDEN / "moe"
MOE_LAYERS = 3


def compare(tmp_path: Path, train: Path, generate: Path, *extra: str) -> tuple[pandas.DataFrame, pandas.DataFrame]:
    found, out = tmp_path / "pairs.jsonl", tmp_path / "report"
    assert main(["align", str(train), str(generate), "-o", str(found)]) == 0
    assert main(["compare", str(found), "-o", str(out), "--jobs", "1", *extra]) == 0
    return pandas.read_csv(out / "pairs.csv"), pandas.read_csv(out / "modules.csv")


def routed(tmp_path: Path) -> pandas.DataFrame:
    return pandas.read_csv(tmp_path / "report" / ROUTING_CSV)


def planted() -> dict:
    return json.loads((MOE / "router_fault.json").read_text())


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_qwen3_compares_its_q_and_k_norms_and_names_nothing(tmp_path, engine):
    results, rows = compare(tmp_path, QWEN3 / "actor", QWEN3 / engine / "generate")
    assert list(results["verdict"]) == [Verdict.NO_DIVERGENCE.value] * 2
    assert list(results["unmatched"]) == [0, 0]
    assert results["max_error"].max() < 1e-5
    for layer in range(2):
        for norm in ("q_norm", "k_norm"):
            found = rows[rows["module"] == f"layers.{layer}.self_attn.{norm}"]
            assert sorted(found["io"]) == ["input", "input", "output", "output"]
            assert set(found["status"]) == {Status.COMPARED.value}
    # the shared rotary module's per-layer calls: layer 1's is layers.0's second call, a rule of the map
    rotary = rows[rows["generate_name"].fillna("").str.contains(r"layers\.0\.self_attn\.rotary_emb\..*forward\.1\.")]
    assert len(rotary) and set(rotary["reason"]) == {names.load().reasons["rotary"]}
    assert "routing" not in (tmp_path / "report" / "summary.md").read_text().lower()  # a dense model


def test_qwen3_a_k_norm_fault_is_named_at_the_k_norm(tmp_path):
    results, rows = compare(tmp_path, QWEN3 / "actor", QWEN3 / "vllm_k_norm" / "generate")
    assert list(results["first_module"]) == ["layers.1.self_attn.k_norm"] * 2
    assert list(results["first_io"]) == ["output"] * 2
    assert results["first_error"].between(0.04, 0.05).all()  # 0.05 / 1.05
    inputs = rows[(rows["module"] == "layers.1.self_attn.k_norm") & (rows["io"] == "input")]
    assert inputs["error"].max() < 1e-5


def test_moe_clean_fp32_names_nothing_and_every_token_keeps_its_experts(tmp_path):
    results, rows = compare(tmp_path, MOE / "actor", MOE / "fp32" / "generate")
    assert list(results["verdict"]) == [Verdict.NO_DIVERGENCE.value] * 2
    assert list(results["unmatched"]) == [0, 0]  # no MoE module without a rule
    assert list(results["routing_flipped"]) == [0, 0] and list(results["routing_layers"]) == [MOE_LAYERS] * 2
    for layer in range(MOE_LAYERS):
        for module in (f"layers.{layer}.mlp", f"layers.{layer}.mlp.gate"):  # the block and the router's logits
            found = rows[(rows["module"] == module) & (rows["status"] == Status.COMPARED.value)]
            assert sorted(found["io"]) == ["input", "input", "output", "output"], module
    reasons = names.load().reasons
    experts = rows[rows["reason"] == reasons["experts"]]
    assert experts["train_name"].str.contains("Qwen3MoeExperts").any()
    assert experts["generate_name"].str.contains("MoERunner").any()  # its router_logits keyword included
    assert rows["generate_name"].fillna("").str.contains("MoERunner.forward.0.input_kwargs.router_logits").any()
    assert (rows["reason"] == reasons["expert_activation"]).sum() == 2 * 2 * MOE_LAYERS  # in and out, per pair
    ids = rows[rows["train_name"].fillna("").str.contains(r"Qwen3MoeTopKRouter\.forward\.0\.output\.2")]
    assert set(ids["reason"]) == {reasons["routing"]}
    table = routed(tmp_path)
    assert set(table["status"]) == {Status.COMPARED.value} and table["flipped"].sum() == 0
    assert set(table["generate_source"].str.split().str[0]) == {"routed_experts.jsonl"}
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "## Routing" in summary and "routing agrees" in summary


def test_a_planted_router_fault_is_named_routing_at_its_layer_with_its_share(tmp_path, capsys):
    results, rows = compare(tmp_path, MOE / "actor", MOE / "router" / "generate")
    fault = planted()
    table = routed(tmp_path)
    by_layer = table.groupby("layer")[["tokens", "flipped"]].sum()
    assert by_layer.loc[0, "flipped"] == 0  # before the fault, the same experts
    share = by_layer.loc[fault["layer"], "flipped"] / by_layer.loc[fault["layer"], "tokens"]
    assert abs(share - fault["share"]) <= 0.03
    diverging = results[results["routing_layer"].notna()]
    assert len(diverging) and set(diverging["first_rule"]) == {FirstRule.ROUTING.value}
    assert set(diverging["first_module"]) == {f"layers.{fault['layer']}.mlp.gate"}
    assert set(diverging["first_io"]) == {"routing"}
    # no numeric row diverges before the router's output of that layer
    for pair in diverging["pair"]:
        mine = rows[rows["pair"] == pair]
        router = mine[(mine["module"] == f"layers.{fault['layer']}.mlp.gate") & (mine["io"] == "output")]
        before = mine[mine["order"] < router["order"].iloc[0]]
        assert not before["steps_up"].fillna(False).any() and not before["diverges"].fillna(False).any()
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert f"routing diverges at layer {fault['layer']}" in summary.split("\n\n")[2]  # the headline
    page = (tmp_path / "report" / "index.html").read_text()
    assert "<h2>Routing</h2>" in page and offline(page)
    assert_answer_first(tmp_path / "report", capsys.readouterr().out)  # routing's verdict too, before the notes


@pytest.mark.parametrize("generate", ["router", "bf16"])  # flips beyond the noise; flips within it only
def test_the_routing_tables_are_what_pandas_made_of_the_layers(tmp_path, generate):
    """routing.csv byte for byte, and the section's sums per layer, as pandas wrote and summed them."""
    found = tmp_path / "pairs.jsonl"
    assert main(["align", str(MOE / "actor"), str(MOE / generate / "generate"), "-o", str(found)]) == 0
    results = compare_file(str(found), str(tmp_path / "report"), CompareOptions(jobs=1)).answer.results
    records = [r.record() for result in results for r in result.routing]
    expected = io.StringIO()
    pandas.DataFrame(records, columns=list(ROUTING_COLUMNS)).to_csv(expected, index=False)
    assert (tmp_path / "report" / ROUTING_CSV).read_text() == expected.getvalue()
    compared = pandas.DataFrame([r for r in records if r["status"] == Status.COMPARED.value])
    sums = compared.groupby("layer", as_index=False)[["tokens", "flipped", "within_noise"]].sum()
    layers = report_routing.by_layer(results)
    assert [(f.layer, f.tokens, f.flipped, f.within_noise) for f in layers] == list(sums.itertuples(index=False))
    assert [f.share for f in layers] == list(sums["flipped"] / sums["tokens"])


def test_a_numeric_fault_before_the_router_is_named_at_its_module_not_as_routing(tmp_path):
    results, _ = compare(tmp_path, MOE / "actor", MOE / "attention" / "generate")
    assert list(results["first_module"]) == ["layers.1.self_attn.o_proj"] * 2
    assert list(results["first_rule"]) == [FirstRule.STEP.value] * 2
    assert results["first_error"].between(0.04, 0.05).all()


def test_bf16_clean_routes_alike_and_blames_no_router(tmp_path):
    results, _ = compare(tmp_path, MOE / "actor", MOE / "bf16" / "generate")
    table = routed(tmp_path)
    assert set(table["status"]) == {Status.COMPARED.value}
    assert set(table["noise"].round(6)) == {round(4 * 2.0**-8, 6)}  # the step rule's bf16 floor
    assert (table["flipped"] == table["within_noise"]).all()
    assert "routing_layer" not in results or results["routing_layer"].isna().all()
    assert FirstRule.ROUTING.value not in set(results["first_rule"].dropna())


def _swap_at_the_edge(tmp_path: Path, relative_margin: str) -> tuple[Path, int]:
    """A copy of the bf16 tree where vLLM sent one token of req-0 to its training router's (k+1)-th expert
    instead of its k-th: the token whose top-k margin (relative to its largest logit) is the smallest
    ("narrow") or the largest ("wide") of any layer. What rounding does at the edge, at a chosen margin."""
    import torch

    generate = tmp_path / "generate"
    shutil.copytree(MOE / "bf16" / "generate", generate)
    (log,) = (MOE / "actor").glob("*/update_actor_log.jsonl")
    (step,) = [
        line["step"] for line in map(json.loads, log.read_text().splitlines()) if line["request_ids"] == ["req-0"]
    ]
    margins = {}
    for path in (MOE / "actor" / f"step{step}" / "rank0" / "dump_tensor_data").glob("*.mlp.gate.*.output.0.pt"):
        logits = torch.load(path)
        ordered = logits.sort(dim=-1, descending=True)
        relative = (ordered.values[:, 1] - ordered.values[:, 2]) / logits.abs().max(dim=-1).values
        layer = int(path.name.split(".layers.")[1].split(".")[0])
        for token, value in enumerate(relative.tolist()):
            margins[(layer, token)] = (value, ordered.indices[token].tolist())
    pick = (min if relative_margin == "narrow" else max)(margins, key=lambda key: margins[key][0])
    layer, token = pick
    ranked = margins[pick][1]
    (log,) = generate.glob(f"*/{routing.ROUTED_EXPERTS_LOG}")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for line in lines:
        if [r["request_id_base"] for r in line["requests"]] == ["req-0"] and line["tokens"] == 6:
            ids = line["layers"][str(layer)][token]
            assert sorted(ids) == sorted(ranked[:2])
            line["layers"][str(layer)][token] = [ranked[0], ranked[2]]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return generate, layer


# The training side's margins from its tensor dump's logits, or from its statistics run's own record (the same model
# and prompts: the token picked by the tensor dump's logits must be judged alike from the record).
TRAINING_TREES = pytest.mark.parametrize("actor", ["actor", "actor_statistics"])


@TRAINING_TREES
def test_a_flip_whose_margin_is_within_the_noise_is_reported_and_not_blamed(tmp_path, actor):
    generate, layer = _swap_at_the_edge(tmp_path, "narrow")
    results, _ = compare(tmp_path, MOE / actor, generate)
    table = routed(tmp_path)
    flipped = table[table["flipped"] > 0]
    assert list(flipped["layer"]) == [layer] and list(flipped["within_noise"]) == [1]
    assert "routing_layer" not in results  # no pair has a routing divergence: the column is left out
    assert FirstRule.ROUTING.value not in set(results["first_rule"].dropna())
    assert (
        "all where the router's top-k margin is within the logits' noise"
        in (tmp_path / "report" / "summary.md").read_text()
    )


@TRAINING_TREES
def test_the_same_flip_at_a_wide_margin_is_named_routing(tmp_path, actor):
    generate, layer = _swap_at_the_edge(tmp_path, "wide")
    results, _ = compare(tmp_path, MOE / actor, generate)
    table = routed(tmp_path)
    flipped = table[table["flipped"] > 0]
    assert list(flipped["layer"]) == [layer] and list(flipped["beyond_noise"]) == [1]
    (named,) = results[results["first_rule"] == FirstRule.ROUTING.value].itertuples()
    assert named.key == "req-0" and named.first_module == f"layers.{layer}.mlp.gate" and named.routing_layer == layer


def test_a_router_fault_in_bf16_is_still_named_routing(tmp_path):
    results, _ = compare(tmp_path, MOE / "actor", MOE / "bf16_router" / "generate")
    fault = planted()
    assert set(results["routing_layer"].dropna()) == {fault["layer"]}
    assert FirstRule.ROUTING.value in set(results["first_rule"])
    table = routed(tmp_path)
    assert table[table["layer"] == 0]["flipped"].sum() == 0


def _without_routing_record(tmp_path: Path, tree: Path) -> Path:
    """A copy of ``tree`` whose processes wrote no routed_experts.jsonl (an older msprobe-hooks, a process that
    died before it wrote one)."""
    copy = tmp_path / f"{tree.parent.name}-{tree.name}"
    shutil.copytree(tree, copy)
    logs = list(copy.glob(f"*/{routing.ROUTED_EXPERTS_LOG}"))
    assert logs, f"the golden {tree} holds its routers' record"
    for log in logs:
        log.unlink()
    return copy


@pytest.mark.parametrize("generate", ["router", "bf16_router"])
def test_a_statistics_dump_routes_as_the_tensor_dump_from_what_its_routers_returned(tmp_path, generate):
    """msprobe's statistics hold the ids' max and min only: the training process's routed_experts.jsonl (ids and
    margins, from its routers' own outputs, beside each dumped window) gives the same routing as the tensor dump."""
    for run in ("statistics", "tensor"):
        (tmp_path / run).mkdir()
    results, _ = compare(tmp_path / "statistics", MOE / "actor_statistics", MOE / generate / "generate")
    compare(tmp_path / "tensor", MOE / "actor", MOE / generate / "generate")
    statistics, tensor = routed(tmp_path / "statistics"), routed(tmp_path / "tensor")
    assert set(statistics["status"]) == {Status.COMPARED.value}
    assert statistics["train_source"].str.startswith(routing.ROUTED_EXPERTS_LOG).all()
    assert not tensor["train_source"].str.startswith(routing.ROUTED_EXPERTS_LOG).any()
    same = ["pair", "layer", "tokens", "flipped", "within_noise", "beyond_noise", "top_k"]
    pandas.testing.assert_frame_equal(statistics[same], tensor[same])
    pandas.testing.assert_series_equal(statistics["margin_min"], tensor["margin_min"], rtol=1e-4)
    fault = planted()
    assert set(results["routing_layer"].dropna()) == {fault["layer"]}
    assert set(results[results["routing_layer"].notna()]["first_rule"]) == {FirstRule.ROUTING.value}


def test_a_statistics_dump_in_bf16_clean_routes_alike_and_blames_no_router(tmp_path):
    results, _ = compare(tmp_path, MOE / "actor_statistics", MOE / "bf16" / "generate")
    table = routed(tmp_path)
    assert set(table["status"]) == {Status.COMPARED.value}
    assert table["flipped"].sum() == table["within_noise"].sum()  # a flip at a near tie only (none in these 10)
    assert FirstRule.ROUTING.value not in set(results["first_rule"].dropna())


def test_without_the_training_record_a_statistics_dump_says_why_routing_is_not_compared(tmp_path):
    actor = _without_routing_record(tmp_path, MOE / "actor_statistics")
    results, _ = compare(tmp_path, actor, MOE / "fp32" / "generate")
    assert list(results["verdict"]) == [Verdict.NO_DIVERGENCE.value] * 2
    table = routed(tmp_path)
    assert set(table["status"]) == {Status.NOT_COMPARABLE.value}
    assert set(table["reason"]) == {routing.STATISTICS_ONLY}
    assert (
        "routing not compared: the training dump holds statistics" in (tmp_path / "report" / "summary.md").read_text()
    )


def test_a_driven_inference_dump_records_its_routing_with_no_switch(tmp_path):
    """``no_routing``: vLLM dumped by MSPROBE_GENERATE_CONFIG without MSPROBE_HOOKS_ROUTING: routing compared."""
    compare(tmp_path, MOE / "actor", MOE / "no_routing" / "generate")
    table = routed(tmp_path)
    assert set(table["status"]) == {Status.COMPARED.value} and table["flipped"].sum() == 0


def test_without_the_inference_record_routing_is_not_compared_and_says_why(tmp_path):
    generate = _without_routing_record(tmp_path, MOE / "no_routing" / "generate")
    compare(tmp_path, MOE / "actor", generate)
    assert set(routed(tmp_path)["reason"]) == {routing.NO_INFERENCE_IDS}


def test_routing_reads_the_routed_experts_log_its_pair_names_and_an_older_pairs_file_finds_it_by_the_layout(tmp_path):
    generate = tmp_path / "generate"
    shutil.copytree(MOE / "fp32" / "generate", generate)
    found, report = tmp_path / "pairs.jsonl", tmp_path / "report"
    assert main(["align", str(MOE / "actor"), str(generate), "-o", str(found)]) == 0
    lines = [json.loads(line) for line in found.read_text().splitlines()]
    (log,) = generate.glob(f"*/{routing.ROUTED_EXPERTS_LOG}")
    assert {line["generate"]["routed_experts_log"] for line in lines} == {str(log.relative_to(tmp_path))}
    moved = tmp_path / "elsewhere.jsonl"  # not where the layout puts it: compare must take the pair's word for it
    log.rename(moved)
    for line in lines:
        line["generate"]["routed_experts_log"] = str(moved)
    found.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["compare", str(found), "-o", str(report), "--jobs", "1"]) == 0
    assert set(routed(tmp_path)["status"]) == {Status.COMPARED.value}
    moved.rename(log)  # an older align's pairs file names no routed-experts log: the layout finds it
    for line in lines:
        del line["generate"]["routed_experts_log"]
    found.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["compare", str(found), "-o", str(report), "--jobs", "1"]) == 0
    assert set(routed(tmp_path)["status"]) == {Status.COMPARED.value}


def test_a_mapping_rule_makes_a_router_of_another_name_compared_and_routed(tmp_path):
    """A made-up architecture whose training router is ``mlp.moe_router``: unmatched and unrouted without a
    rule; with one rule from ``--mapping`` (the router kind) its logits compare and its choices are routed."""
    train = tmp_path / "actor"
    shutil.copytree(MOE / "actor", train)
    for path in train.rglob("*"):
        if ".mlp.gate." in path.name:
            path.rename(path.with_name(path.name.replace(".mlp.gate.", ".mlp.moe_router.")))
    for path in golden.dumps(train):
        path.write_text(path.read_text().replace(".mlp.gate.", ".mlp.moe_router."))
    without = tmp_path / "without"
    without.mkdir()
    results, rows = compare(without, train, MOE / "fp32" / "generate")
    assert (results["unmatched"] > 0).all()
    assert set(rows[rows["module"].fillna("").str.contains("moe_router")]["status"]) == {Status.UNMATCHED.value}
    assert set(routed(without)["reason"]) == {routing.NO_TRAINING_ROUTER}
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text(
        "rules:\n"
        '  - module: "layers.{layer}.mlp.gate"\n'
        '    names: ["layers.{layer}.mlp.gate", "layers.{layer}.mlp.moe_router"]\n'
        "    compare: router\n"
    )
    with_rule = tmp_path / "with"
    with_rule.mkdir()
    results, rows = compare(with_rule, train, MOE / "fp32" / "generate", "--mapping", str(mapping))
    assert list(results["unmatched"]) == [0, 0]
    gate = rows[rows["module"] == "layers.1.mlp.gate"]
    assert set(gate["status"]) == {Status.COMPARED.value} and gate["train_name"].str.contains("moe_router").all()
    table = routed(with_rule)
    assert set(table["status"]) == {Status.COMPARED.value} and table["flipped"].sum() == 0


def test_a_shared_expert_compares_its_parts_and_its_gate(tmp_path):
    """Qwen2-MoE's gated shared expert (golden ``shared_experts``, statistics): the whole is gated on different
    sides (HF after the module, vLLM inside), its projections and its gate compare one to one."""
    results, rows = compare(
        tmp_path, golden.GOLDEN / "shared_experts" / "actor", golden.GOLDEN / "shared_experts" / "vllm" / "generate"
    )
    assert list(results["verdict"]) == [Verdict.NO_DIVERGENCE.value] * 2
    assert list(results["unmatched"]) == [0, 0]
    for part in ("gate_up_proj", "down_proj"):
        found = rows[rows["module"] == f"layers.1.mlp.shared_expert.{part}"]
        assert sorted(found["io"]) == ["input", "input", "output", "output"] and set(found["status"]) == {"compared"}
    gate = rows[rows["module"] == "layers.1.mlp.shared_expert_gate"]
    assert set(gate["status"]) == {"compared"} and len(gate) == 4
    whole = rows[rows["generate_name"].fillna("").str.contains(r"shared_expert\.Qwen2MoeMLP\.forward\.0\.output")]
    assert set(whole["reason"]) == {names.load().reasons["shared_expert_gated"]}


def test_sglang_routes_alike_read_from_its_topk_module_in_tensor_mode(tmp_path):
    """SGLang's CPU engine runs the Qwen3-MoE (golden ``moe_sglang``: tensor mode, no routing switch): its TopK
    module's ids are its choice, its FusedMoE the experts; nothing unmatched, every token keeps its experts."""
    results, rows = compare(tmp_path, MOE / "actor", golden.GOLDEN / "moe_sglang" / "generate")
    assert list(results["verdict"]) == [Verdict.NO_DIVERGENCE.value] * 2
    assert list(results["unmatched"]) == [0, 0]
    assert list(results["routing_layers"]) == [MOE_LAYERS] * 2 and list(results["routing_flipped"]) == [0, 0]
    table = routed(tmp_path)
    assert table["generate_source"].str.endswith("mlp.topk.TopK.forward.0.output.topk_ids").all()
    topk = rows[rows["generate_name"].fillna("").str.contains(r"\.mlp\.topk\.TopK\.")]
    assert len(topk) and set(topk["reason"]) == {names.load().reasons["routing"]}
    experts = rows[
        rows["generate_name"].fillna("").str.contains(r"\.mlp\.experts\.FusedMoE\.forward\.0\.(?:input|output)")
    ]
    assert len(experts) and set(experts["reason"]) == {names.load().reasons["experts"]}


def test_a_flip_on_the_sglang_side_is_found_in_its_topk_ids(tmp_path):
    """The SGLang tree with one token of layer 2 sent to other experts (its TopK ids file edited): found there."""
    import torch

    generate = tmp_path / "generate"
    shutil.copytree(golden.GOLDEN / "moe_sglang" / "generate", generate)
    (path,) = sorted(generate.glob("*/step0/rank0/dump_tensor_data/*.layers.2.mlp.topk.*.topk_ids.pt"))
    ids = torch.load(path)
    unused = next(e for e in range(8) if e not in ids[0].tolist())
    ids[0, 1] = unused
    torch.save(ids, path)
    results, _ = compare(tmp_path, MOE / "actor", generate)
    table = routed(tmp_path)
    assert table[table["flipped"] > 0][["pair", "layer", "flipped"]].values.tolist() == [[0, 2, 1]]
    assert list(results["routing_layer"].dropna()) == [2.0]
