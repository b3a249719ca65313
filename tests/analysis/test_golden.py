"""align, compare, the name map and the report on the golden trees (real dumps, cut once): no engine starts.

``tests/golden/`` holds real dumps of verl's FSDP2 engine, vLLM's and SGLang's CPU engines (and the
FSDP2 tree under FSDP1's names) of one tiny model on two prompts; ``scripts/make_golden.py`` says how
they were made. Faults are planted in a copy: in the weights (``vllm_perturbed``, a real run) or in the
statistics of one module's output (what a scaled weight does to that output; the downstream stays as it
was, so the place is known exactly).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas
import pytest
from support import golden
from support.compare_runs import raw_pairs, write_raw
from support.pages import assert_answer_first, offline, plotted, printed_verdicts

from msprobe_hooks.analysis.comparing import names
from msprobe_hooks.analysis.pairing import pairs
from msprobe_hooks.analysis.results import MODULE_COLUMNS, OPTIONAL_PAIR_COLUMNS, PAIR_RESULT_COLUMNS, Status, Verdict
from msprobe_hooks.cli import main

# Per decoder layer: the two norms, qkv, o_proj, attn, self_attn, gate_up, act_fn, down_proj, mlp
# (inputs and outputs) and the layer's output; plus the embedding and the final norm.
COMPARED_PER_PAIR = 19 * golden.LAYERS + 4


def align(tmp_path: Path, train: str, generate: str, *extra: str) -> list[pairs.Pair]:
    out = tmp_path / f"{train.replace('/', '-')}-{generate.replace('/', '-')}.jsonl"
    train_root = golden.GOLDEN / train if not Path(train).is_absolute() else Path(train)
    generate_root = golden.GOLDEN / generate if not Path(generate).is_absolute() else Path(generate)
    assert main(["align", str(train_root), str(generate_root), "-o", str(out), *extra]) == 0
    return list(pairs.read(str(out)))


def compare(pairs_file: Path, out: Path, *extra: str, status: int = 0) -> tuple[pandas.DataFrame, pandas.DataFrame]:
    assert main(["compare", str(pairs_file), "-o", str(out), "--jobs", "1", *extra]) == status
    return pandas.read_csv(out / "pairs.csv"), pandas.read_csv(out / "modules.csv")


def pairs_file(tmp_path: Path, train: str, generate: str) -> Path:
    align(tmp_path, train, generate)
    return tmp_path / f"{train.replace('/', '-')}-{generate.replace('/', '-')}.jsonl"


@pytest.mark.parametrize(
    ("train", "generate"),
    [("fsdp2/actor", "vllm/generate"), ("fsdp1/actor", "vllm/generate"), ("fsdp2/actor", "sglang/generate")],
)
def test_every_naming_pairs_both_prompts_by_request_id(tmp_path, train, generate):
    found = align(tmp_path, train, generate)
    assert sorted(p.key for p in found) == sorted(golden.PROMPTS)
    assert {p.rule for p in found} == {pairs.JoinRule.REQUEST_ID}
    assert {p.key: p.prompt_len for p in found} == {k: len(v) for k, v in golden.PROMPTS.items()}


@pytest.mark.parametrize(
    ("train", "generate"),
    [("fsdp2/actor", "vllm/generate"), ("fsdp1/actor", "vllm/generate"), ("fsdp2/actor", "sglang/generate")],
)
def test_identical_weights_compare_everything_and_name_nothing(tmp_path, train, generate):
    results, rows = compare(pairs_file(tmp_path, train, generate), tmp_path / "report")
    assert list(results["verdict"]) == [Verdict.NO_DIVERGENCE.value] * 2
    assert list(results["compared"]) == [COMPARED_PER_PAIR] * 2
    assert list(results["unmatched"]) == [0, 0]
    assert results["max_error"].max() < 1e-5  # fp32 on both sides: ~1e-6
    assert not rows["steps_up"].fillna(False).any() and not rows["diverges"].fillna(False).any()


def test_the_planted_weight_is_named_by_both_rules(tmp_path):
    results, rows = compare(pairs_file(tmp_path, "fsdp2/actor", "vllm_perturbed/generate"), tmp_path / "report")
    assert list(results["verdict"]) == [Verdict.DIVERGES.value] * 2
    assert list(results["first_module"]) == ["layers.1.mlp.down_proj"] * 2
    assert list(results["first_io"]) == ["output"] * 2
    assert list(results["first_rule"]) == ["step"] * 2
    assert list(results["threshold_module"]) == ["layers.1.mlp.down_proj"] * 2
    assert results["first_error"].between(0.04, 0.05).all()  # 0.05 / 1.05


def test_a_small_change_of_a_fused_part_is_named_by_the_step_rule_and_missed_by_the_threshold(tmp_path):
    """``up_proj`` x1.01 shows in the fused ``gate_up_proj`` statistics (its gate half unchanged) at <= 1 %:
    a step up from fp32 noise (~1e-7), below the fixed 2e-2 everywhere (down_proj's input moves by 1 % too)."""
    train = golden.copy("fsdp2", tmp_path)
    assert golden.scale_output(train, "layers.0.mlp.up_proj", 1.01) == 2
    golden.scale_output(train, "layers.0.mlp.down_proj", 1.01)  # what the changed up_proj feeds
    golden.scale_output(train, "layers.0.mlp.down_proj", 1.01, io="input")
    found = tmp_path / "pairs.jsonl"
    assert main(["align", str(train / "actor"), str(golden.GOLDEN / "vllm" / "generate"), "-o", str(found)]) == 0
    results, rows = compare(found, tmp_path / "report")
    assert list(results["verdict"]) == [Verdict.DIVERGES.value] * 2
    assert list(results["first_module"]) == ["layers.0.mlp.gate_up_proj"] * 2
    assert list(results["first_io"]) == ["output"] * 2
    assert list(results["first_rule"]) == ["step"] * 2
    assert (results["first_error"] <= 0.0101).all()
    assert results["threshold_module"].isna().all()  # the fixed threshold names nothing
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "the fixed threshold 0.02 names nothing" in summary  # both rules reported where they disagree


def test_a_user_mapping_compares_a_module_the_built_in_map_does_not_know(tmp_path):
    """A made-up architecture: the training side calls the MLP's output projection ``out_proj``, the
    inference side ``fused_out``. Unmatched without a rule; compared with one from ``--mapping``."""
    train, generate = golden.copy("fsdp2", tmp_path), golden.copy("vllm", tmp_path)
    rename = {train: ".mlp.down_proj.", generate: ".mlp.down_proj."}
    new = {train: ".mlp.out_proj.", generate: ".mlp.fused_out."}
    for root in (train, generate):
        for path in golden.dumps(root):
            path.write_text(path.read_text().replace(rename[root], new[root]))
    found = tmp_path / "pairs.jsonl"
    assert main(["align", str(train / "actor"), str(generate / "generate"), "-o", str(found)]) == 0
    _, rows = compare(found, tmp_path / "without")
    assert (rows["module"].fillna("").str.contains("mlp.out_proj|mlp.fused_out")).sum() > 0
    assert set(rows[rows["module"].fillna("").str.contains("out_proj|fused_out")]["status"]) == {"unmatched"}
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text(
        "rules:\n"
        '  - module: "layers.{layer}.mlp.out"\n'
        '    names: ["layers.{layer}.mlp.out_proj", "layers.{layer}.mlp.fused_out"]\n'
        '    also: {input: "layers.{layer}.mlp.act_fn output"}\n'  # its input is the fused activation's output
    )
    results, rows = compare(found, tmp_path / "with", "--mapping", str(mapping))
    out = rows[rows["module"] == "layers.1.mlp.out"]
    assert set(out["status"]) == {"compared"} and set(out["io"]) == {"input", "output"}
    assert list(results["unmatched"]) == [0, 0]
    json_mapping = tmp_path / "mapping.json"  # the same rules in JSON
    json_mapping.write_text(
        json.dumps(
            {
                "rules": [
                    {
                        "module": "layers.{layer}.mlp.out",
                        "names": ["layers.{layer}.mlp.out_proj", "layers.{layer}.mlp.fused_out"],
                        "also": {"input": "layers.{layer}.mlp.act_fn output"},
                    }
                ]
            }
        )
    )
    _, rows_json = compare(found, tmp_path / "with-json", "--mapping", str(json_mapping))
    assert rows_json["status"].tolist() == rows["status"].tolist()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("rules: [{names: [x]}]\n", "each rule is a mapping with a module"),
        ("rules: [{module: m, compare: fuzzy}]\n", "compare: 'fuzzy'; accepted: one_to_one"),
        ("rules: [{module: m, compare: not_comparable}]\n", "needs a reason"),
        ("rules: [{module: m, colour: red}]\n", "unknown field(s) colour"),
        ("rules: [{module: m, also: {sideways: 'a output'}}]\n", "also: sideways"),
        ("[1, 2\n", "not YAML or JSON"),
    ],
)
def test_a_bad_mapping_file_stops_compare_before_any_pair_with_one_line(tmp_path, capsys, text, said):
    mapping = tmp_path / "bad.yaml"
    mapping.write_text(text)
    found = pairs_file(tmp_path, "fsdp2/actor", "vllm/generate")
    capsys.readouterr()
    assert main(["compare", str(found), "-o", str(tmp_path / "r"), "--mapping", str(mapping)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(mapping) in err[0] and said in err[0]
    assert not (tmp_path / "r").exists()


def test_the_built_in_map_covers_msprobes_own_megatron_and_fsdp_maps():
    """msprobe's compare maps Megatron's and FSDP's names onto vLLM's (msprobe/core/compare/verl/mapping.py):
    each pair it knows must be the same canonical module here."""
    from msprobe.core.compare.verl.mapping import FSDP_MODULE_MAP, MEGATRON_MODULE_MAP

    table = names.load()
    for training, inference in {**MEGATRON_MODULE_MAP, **FSDP_MODULE_MAP}.items():
        scope = "model" if training == "word_embeddings" else "layers.3"
        parent = {"linear_qkv": "self_attention", "q_layernorm": "self_attention", "k_layernorm": "self_attention",
                  "core_attention": "self_attention", "linear_proj": "self_attention", "router": "mlp",
                  "linear_fc1": "mlp", "linear_fc2": "mlp", "q_proj": "self_attn", "k_proj": "self_attn",
                  "v_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp"}.get(training)  # fmt: skip
        inference_parent = {"self_attention": "self_attn"}.get(parent, parent)
        left = ".".join(p for p in (scope, parent, training) if p)
        right = ".".join(p for p in (scope, inference_parent, inference) if p)
        found = [table.lookup(path, "") for path in (left, right)]
        assert None not in found, f"{left} or {right} has no rule"
        assert found[0][0].module == found[1][0].module, f"{left} and {right} are different modules here"


def test_report_columns_are_the_row_types_fields(tmp_path):
    results, rows = compare(pairs_file(tmp_path, "fsdp2/actor", "vllm/generate"), tmp_path / "report")
    assert list(rows.columns) == list(MODULE_COLUMNS)
    # no pair failed, no routing compared (a dense model): the optional columns are left out
    assert list(results.columns) == [c for c in PAIR_RESULT_COLUMNS if c not in OPTIONAL_PAIR_COLUMNS]
    assert set(rows["status"]) <= {s.value for s in Status}
    page = (tmp_path / "report" / "index.html").read_text()
    assert offline(page)


def test_the_report_opens_with_the_verdict(tmp_path, capsys):
    compare(pairs_file(tmp_path, "fsdp2/actor", "vllm_perturbed/generate"), tmp_path / "report")
    printed = capsys.readouterr().out
    assert printed_verdicts(printed) == [
        "cause: module (prefill): layers.1.mlp.down_proj output computes differently on agreeing inputs (its weights "
        "or its kernel)",
        "first divergence: layers.1.mlp.down_proj output (error 0.0476, a step up from 2.26e-07 before it; first in 2 "
        "of 2 pairs)",
    ]
    assert_answer_first(tmp_path / "report", printed)
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert summary.index("## Pairs") > summary.index("- Threshold: ")  # the evidence after the answer


def test_the_depth_figure_names_its_modules_in_the_png_and_on_the_page(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    drawn = {}
    savefig = Figure.savefig

    def keep(figure, path, *args, **kwargs):
        drawn[Path(path).name] = figure
        savefig(figure, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)  # --jobs 1: the PNGs are drawn in this process
    compare(pairs_file(tmp_path, "fsdp2/actor", "vllm_perturbed/generate"), tmp_path / "report")
    expected = ["embed_tokens", *(f"layers.{layer}" for layer in range(golden.LAYERS)), "norm"]
    (axes,) = drawn["error_by_depth.png"].axes
    assert [label.get_text() for label in axes.get_xticklabels()] == expected
    page = (tmp_path / "report" / "index.html").read_text()
    _, layout = plotted(page, "plot")
    assert layout["xaxis"]["ticktext"] == expected
    assert layout["title"]["text"] == axes.get_title()  # one title: the page's figure and the PNG draw one data
    assert layout["xaxis"]["title"]["text"] == axes.get_xlabel()


def test_a_section_is_one_record(tmp_path, monkeypatch, capsys):
    """What docs/development.md's "How to add a report section" shows: a builder added to SECTIONS puts its verdict
    under the title, its Markdown and HTML before the pairs, its figure as a PNG and on the page, its files in the
    page's list."""
    from msprobe_hooks.analysis.report import figures, interactive, plots, writer
    from msprobe_hooks.analysis.report.sections import Figure, Section

    def tokens(folder, found):
        Path(folder, "tokens.csv").write_text("pair,tokens\n")
        data = figures.depth([], found.results, 0.02)
        return Section(
            "tokens", "tokens: every pair has its tokens", ("tokens.csv",), "## Tokens\n\nPer pair.", "<h2>Tokens</h2>",
            Figure("tokens.png", "tokens by pair", data, plots.depth, interactive.depth),
        )  # fmt: skip

    monkeypatch.setattr(writer, "SECTIONS", (*writer.SECTIONS, tokens))
    found = pairs_file(tmp_path, "fsdp2/actor", "vllm/generate")
    capsys.readouterr()
    compare(found, tmp_path / "report")
    assert capsys.readouterr().out.splitlines()[2] == "tokens: every pair has its tokens"  # printed as in the report
    report = tmp_path / "report"
    summary = (report / "summary.md").read_text().split("\n\n")
    assert summary[3] == "**tokens: every pair has its tokens**"  # after the cause and the first divergence
    assert summary.index("## Tokens") + 2 == summary.index("![tokens by pair](tokens.png)") < summary.index("## Pairs")
    assert (report / "tokens.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (report / "index.html").read_text()
    assert '<h2>Tokens</h2><div style="height:420px; width:100%;">' in page and 'id="tokens"' in page
    assert page.index('id="tokens"') < page.index("<h2>Pairs</h2>") and offline(page)
    assert '<a href="tokens.csv">tokens.csv</a>, <a href="tokens.png">tokens.png</a>.</p>' in page


def test_a_long_run_page_lists_the_diverging_pairs_first_and_says_how_many_it_left_out(tmp_path, monkeypatch):
    from msprobe_hooks.analysis.report import writer as report

    clean = raw_pairs(pairs_file(tmp_path, "fsdp2/actor", "vllm/generate"))
    faulty = raw_pairs(pairs_file(tmp_path, "fsdp2/actor", "vllm_perturbed/generate"))
    both = tmp_path / "both.jsonl"
    write_raw([{**record, "pair": i} for i, record in enumerate(clean + faulty)], both)  # 0-1 clean, 2-3 diverge
    monkeypatch.setattr(report, "DETAILED_PAIRS", 3)
    results, _ = compare(both, tmp_path / "report")
    assert list(results["verdict"]) == [Verdict.NO_DIVERGENCE.value] * 2 + [Verdict.DIVERGES.value] * 2
    page = (tmp_path / "report" / "index.html").read_text()
    listed = [int(part.split(" ", 1)[0]) for part in page.split("<details><summary>pair ")[1:]]
    assert listed == [0, 2, 3]  # both diverging pairs, then the first clean one, in pair order
    assert "Listed here: 3 of 4 pairs (the diverging and failed first); 1 more in it." in page


def test_tensor_mode_pairs_compare_tensors(tmp_path):
    results, rows = compare(pairs_file(tmp_path, "tensor/actor", "tensor/generate"), tmp_path / "report")
    assert list(results["mode"]) == ["tensor"] * 2
    assert list(results["verdict"]) == [Verdict.NO_DIVERGENCE.value] * 2
    compared = rows[rows["status"] == "compared"]
    assert compared["cosine"].min() > 0.99999 and compared["tensor_rel"].max() < 1e-5


def test_a_damaged_dump_fails_its_pair_only_and_names_the_file(tmp_path, capsys):
    generate = golden.copy("vllm", tmp_path)
    found = tmp_path / "pairs.jsonl"
    assert main(["align", str(golden.GOLDEN / "fsdp2" / "actor"), str(generate / "generate"), "-o", str(found)]) == 0
    damaged = pairs.read(str(found)).__next__().generate.dump
    Path(damaged).write_text(Path(damaged).read_text()[:500])  # truncated, as a killed writer leaves it
    results, _ = compare(found, tmp_path / "report", status=1)
    assert sorted(results["verdict"]) == sorted([Verdict.FAILED.value, Verdict.NO_DIVERGENCE.value])
    message = results["message"].dropna().iloc[0]
    assert damaged in message and "truncated" in message
