"""``msprobe-hooks compare`` on real dump pairs: verl's FSDP2 engine against vLLM's CPU engine.

The dumps come from the real engines (``tests/support/compare_runs.py``), each run once per module:
level L0 statistics on the same weights and on a copy with ``layers.1.mlp.down_proj`` x1.05 on
the inference side, and level mix at task tensor (module and API rows, tensors compared). Each test compares
through the CLI, as a user does, and reads the report it wrote.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas
import pytest
from support.compare_runs import align, msprobe_config, raw_pairs, run_compare, run_training, run_vllm, write_raw
from support.pages import figures_drawn, offline, rendered

from cpu_kit.demo_inputs import LAYERS, PERTURBATION, PERTURBED_MODULE, PROMPT_LENS, build_models, write_prompts
from msprobe_hooks.analysis.comparing import compare, names
from msprobe_hooks.analysis.comparing.statistics import fuse
from msprobe_hooks.analysis.results import Status, Verdict

pytestmark = pytest.mark.engine  # runs a real engine (make test-fast leaves it out)

# Per decoder layer: the two norms, qkv, o_proj, attn, self_attn, gate_up, act_fn, down_proj, mlp
# (inputs and outputs) and the layer's output; plus the embedding and the final norm.
COMPARED_PER_PAIR = 19 * LAYERS + 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    model, perturbed = build_models(root)
    return root, model, perturbed, write_prompts(root / "prompts.jsonl")


def _pairs(setup, name: str, task: str, level: str, model: Path | None = None, train_root: Path | None = None):
    root, same, _, prompts = setup
    folder = root / name
    config = msprobe_config(root / f"{task}-{level}.json", task, level)
    train_root = train_root or run_training(folder / "train", same, prompts, config)
    generate_root = run_vllm(folder / "generate", model or same, prompts, config)
    pairs = align(train_root, generate_root, folder / "pairs.jsonl")
    # one pair per prompt, joined by the request id the rollout sent (vLLM's suffix stripped)
    assert sorted(p["key"] for p in pairs) == [f"req-{i}" for i in range(len(PROMPT_LENS))]
    assert {p["rule"] for p in pairs} == {"request_id"}
    assert [p["prompt_len"] for p in sorted(pairs, key=lambda p: p["key"])] == list(PROMPT_LENS)
    return folder / "pairs.jsonl", train_root


@pytest.fixture(scope="module")
def l0(setup):
    return _pairs(setup, "l0", "statistics", "L0")


@pytest.fixture(scope="module")
def l0_perturbed(setup, l0):
    return _pairs(setup, "l0-perturbed", "statistics", "L0", model=setup[2], train_root=l0[1])[0]


def test_identical_weights_no_divergence(l0, tmp_path):
    done, results, rows = run_compare(l0[0], tmp_path / "report")
    assert list(results["verdict"]) == [Verdict.NO_DIVERGENCE] * 4
    assert list(results["compared"]) == [COMPARED_PER_PAIR] * 4
    assert list(results["unmatched"]) == [0] * 4
    assert results["max_error"].max() < 1e-5  # measured <= 1.3e-6 in fp32
    cause, first = done.stdout.splitlines()[:2]
    assert cause.startswith("cause: none: ") and first.startswith(f"4 pairs: {Verdict.NO_DIVERGENCE}")
    # the [1,T,H] training tensors met their [T,H] inference counterparts
    row = rows[(rows["module"] == "layers.0.self_attn.qkv_proj") & (rows["io"] == "output")].iloc[0]
    assert row["status"] == Status.COMPARED
    assert row["train_shape"].startswith("6x") and row["generate_shape"].startswith("6x")
    # vLLM's fused-residual norm: output 1 is the training norm's input and the previous layer's output
    stream = rows[(rows["pair"] == 0) & (rows["module"] == "layers.0") & (rows["io"] == "output")].iloc[0]
    assert stream["generate_name"].endswith("layers.1.input_layernorm.RMSNorm.forward.0.output.1")
    assert stream["train_name"].endswith("layers.0.FSDPQwen2DecoderLayer.forward.0.output.0")
    # parameters (vLLM CPU leaves .weight empty) are listed, never compared
    weights = rows[rows["train_name"].fillna("").str.contains(".parameters.")]
    assert len(weights) and set(weights["status"]) == {Status.NOT_COMPARABLE}


def test_perturbed_weights_name_the_module(l0_perturbed, tmp_path):
    done, results, rows = run_compare(l0_perturbed, tmp_path / "report")
    assert list(results["verdict"]) == [Verdict.DIVERGES] * 4
    assert list(results["first_module"]) == [PERTURBED_MODULE] * 4
    assert list(results["first_io"]) == ["output"] * 4
    expected = (PERTURBATION - 1) / PERTURBATION  # |train - gen| / |gen| with gen = 1.05 train
    assert results["first_error"].sub(expected).abs().max() < 1e-3
    assert f"first divergence: {PERTURBED_MODULE} output" in done.stdout
    # its input still agrees: the change is inside that module
    inputs = rows[(rows["module"] == PERTURBED_MODULE) & (rows["io"] == "input")]
    assert inputs["error"].max() < 1e-5
    # the same threshold an order of magnitude lower still blames that module first, not layer 0
    _, strict, _ = run_compare(l0_perturbed, tmp_path / "strict", "--threshold", "1e-4")
    assert list(strict["first_module"]) == [PERTURBED_MODULE] * 4


def test_fused_statistics_follow_from_parts(l0):
    """qkv_proj and gate_up_proj of vLLM against the exact combination of the training parts."""
    (pair, *_) = raw_pairs(l0[0])
    train = compare.read_side(pair["train"]["dump"], names.load())
    generate = compare.read_side(pair["generate"]["dump"], names.load())
    for module in ("layers.2.self_attn.qkv_proj", "layers.2.mlp.gate_up_proj"):
        held = train.tensors[(module, "output", 0)]
        assert len(held.parts) == names.load().parts_of(module)
        parts = [stats for _, stats, _ in held.in_order()]
        fused = fuse(parts)
        numel = sum(p.numel for p in parts)
        assert fused.max == max(p.max for p in parts) and fused.min == min(p.min for p in parts)
        assert fused.mean == pytest.approx(sum(p.mean * p.numel for p in parts) / numel, rel=1e-12)
        assert fused.norm == pytest.approx(math.sqrt(sum(p.norm**2 for p in parts)), rel=1e-12)
        ((_, vllm_stats, _),) = generate.tensors[(module, "output", 0)].in_order()
        assert fused.shape == vllm_stats.shape  # [T, q+k+v] from [1,T,q], [1,T,k], [1,T,v]
        for stat in ("max", "min", "norm"):
            assert getattr(fused, stat) == pytest.approx(getattr(vllm_stats, stat), rel=1e-5)


def test_unmatched_modules_are_listed_never_passed(l0, tmp_path):
    """A module missing on one side, and a pair whose names match nothing, as msprobe compare gets on FSDP2."""
    (pair, second, *_) = raw_pairs(l0[0])
    generate = json.loads(Path(pair["generate"]["dump"]).read_text())
    dropped = "Module.model.layers.2.self_attn.o_proj.RowParallelLinear.forward.0"
    del generate["data"][dropped]
    (tmp_path / "gen.json").write_text(json.dumps(generate))
    train = json.loads(Path(second["train"]["dump"]).read_text())
    train["data"] = {k.replace("Module.model.", "Module.model.custom_"): v for k, v in train["data"].items()}
    (tmp_path / "train.json").write_text(json.dumps(train))
    edited = [
        {**pair, "generate": {**pair["generate"], "dump": "gen.json"}},
        {**second, "train": {**second["train"], "dump": "train.json"}},
    ]
    write_raw(edited, str(tmp_path / "pairs.jsonl"))
    _, results, rows = run_compare(tmp_path / "pairs.jsonl", tmp_path / "report", status=1)
    first = rows[rows["pair"] == pair["pair"]]
    lost = first[first["module"] == "layers.2.self_attn.o_proj"]
    assert set(lost["status"]) == {Status.UNMATCHED} and len(lost) == 2  # its input and output
    assert (first["status"] == Status.UNMATCHED).sum() == 2
    assert results.iloc[0]["verdict"] == Verdict.NO_DIVERGENCE
    assert results.iloc[0]["compared"] == COMPARED_PER_PAIR - 2
    nothing = results[results["pair"] == second["pair"]].iloc[0]
    assert nothing["verdict"] == Verdict.NOTHING_COMPARED and nothing["compared"] == 0
    assert nothing["unmatched"] > 0


def test_fsdp1_and_megatron_names_map_like_fsdp2(l0, tmp_path):
    """The training names rewritten the way FSDP1 (and a Megatron chunk list) write them still line up."""
    (pair, *_) = raw_pairs(l0[0])
    train = json.loads(Path(pair["train"]["dump"]).read_text())
    fsdp1 = {}
    for key, value in train["data"].items():
        key = key.replace("Module.model.layers.", "Module.0._fsdp_wrapped_module.model.layers.")
        fsdp1[key.replace(".self_attn.", "._fsdp_wrapped_module.self_attn.")] = value
    train["data"] = fsdp1
    (tmp_path / "fsdp1.json").write_text(json.dumps(train))
    write_raw([{**pair, "train": {**pair["train"], "dump": "fsdp1.json"}}], str(tmp_path / "pairs.jsonl"))
    _, results, _ = run_compare(tmp_path / "pairs.jsonl", tmp_path / "report")
    assert results.iloc[0]["compared"] == COMPARED_PER_PAIR
    assert results.iloc[0]["verdict"] == Verdict.NO_DIVERGENCE
    megatron = names.parse(
        "Module.0.module.module.decoder.layers.3.self_attention.linear_qkv.ColumnParallelLinear.forward.0"
    )
    assert names.load().canonical(megatron) == ("layers.3.self_attn.qkv_proj", None)
    assert names.load().canonical(
        names.parse("Module.module.decoder.layers.0.mlp.linear_fc2.RowParallelLinear.forward.0")
    ) == (
        "layers.0.mlp.down_proj",
        None,
    )


@pytest.fixture(scope="module")
def mix_tensor(setup):
    """Level mix (module and API rows) at task tensor: one run for the two tests below."""
    return _pairs(setup, "mix-tensor", "tensor", "mix")[0]


def test_mix_level_api_rows_stay_out_of_the_verdict(mix_tensor, tmp_path):
    done, results, rows = run_compare(mix_tensor, tmp_path / "report")
    assert list(results["verdict"]) == [Verdict.NO_DIVERGENCE] * 4
    assert list(results["compared"]) == [COMPARED_PER_PAIR] * 4
    train_api, generate_api = (int(n) for n in results.iloc[0]["api_rows"].split("/"))
    assert train_api > 0 and generate_api > 0  # Functional./Tensor./Torch. rows were there
    names_seen = pandas.concat([rows["train_name"], rows["generate_name"]]).dropna()
    assert not names_seen.str.startswith(names.API_PREFIXES).any()


def test_tensor_mode_compares_tensors(mix_tensor, tmp_path):
    _, results, rows = run_compare(mix_tensor, tmp_path / "report")
    assert list(results["mode"]) == ["tensor"] * 4
    assert list(results["verdict"]) == [Verdict.NO_DIVERGENCE] * 4
    compared = rows[rows["status"] == Status.COMPARED]
    assert len(compared) == 4 * COMPARED_PER_PAIR
    assert compared["cosine"].min() > 0.99999
    assert compared["tensor_rel"].max() < 1e-5
    # fused qkv: the three training tensors concatenated, element by element against vLLM's
    qkv = compared[(compared["module"] == "layers.1.self_attn.qkv_proj") & (compared["io"] == "output")]
    assert len(qkv) == 4 and qkv["tensor_rel"].max() < 1e-5


def test_report_files_and_the_plot_in_chromium(l0_perturbed, tmp_path):
    out = tmp_path / "report"
    run_compare(l0_perturbed, out)
    for name in ("summary.md", "modules.csv", "error_by_depth.png", "index.html"):
        assert (out / name).stat().st_size > 0, name
    summary = (out / "summary.md").read_text()
    assert f"first divergence: {PERTURBED_MODULE} output" in summary
    page = (out / "index.html").read_text()
    assert offline(page)
    dom = rendered(out / "index.html")
    assert figures_drawn(dom) == 1, "the depth plot was not drawn by the browser"
    assert dom.count('class="trace scatter') >= 2  # a line per pair, drawn


def test_a_lone_tensor_parallel_shard_is_not_comparable_and_says_what_to_dump(l0, tmp_path):
    """An inference rank holding half of a column-parallel output (TP 2 against unsharded training), the pair
    naming no other rank's dump (tests/analysis/test_shards.py: with every rank, made whole)."""
    (pair, *_) = raw_pairs(l0[0])
    generate = json.loads(Path(pair["generate"]["dump"]).read_text())
    qkv = generate["data"]["Module.model.layers.0.self_attn.qkv_proj.QKVParallelLinear.forward.0"]
    qkv["output"][0]["shape"][-1] //= 2
    o_proj = generate["data"]["Module.model.layers.0.self_attn.o_proj.RowParallelLinear.forward.0"]
    o_proj["input_args"][0]["shape"][-1] //= 2
    (tmp_path / "gen.json").write_text(json.dumps(generate))
    write_raw([{**pair, "generate": {**pair["generate"], "dump": "gen.json"}}], str(tmp_path / "pairs.jsonl"))
    _, results, rows = run_compare(tmp_path / "pairs.jsonl", tmp_path / "report")
    sharded = rows[rows["reason"].fillna("").str.startswith("a tensor-parallel shard")]
    assert sorted(zip(sharded["module"], sharded["io"], strict=True)) == [
        ("layers.0.self_attn.o_proj", "input"),
        ("layers.0.self_attn.qkv_proj", "output"),
    ]
    assert set(sharded["status"]) == {Status.NOT_COMPARABLE}
    assert results.iloc[0]["compared"] == COMPARED_PER_PAIR - 2
    assert results.iloc[0]["verdict"] == Verdict.NO_DIVERGENCE


def test_bad_input_one_line_and_partial_results(l0, tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "msprobe_hooks", "compare", *args, "-o", str(tmp_path / "out")]
        return subprocess.run(command, capture_output=True, text=True, timeout=300)

    missing = cli(str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "nope.jsonl" in missing.stderr and len(missing.stderr.splitlines()) == 1
    bad = cli(str(l0[0]), "--threshold", "-1")
    assert bad.returncode == 2 and "--threshold -1" in bad.stderr
    (tmp_path / "broken.jsonl").write_text('{"pair": 0}\n')
    broken = cli(str(tmp_path / "broken.jsonl"))
    assert broken.returncode == 2 and "broken.jsonl:1" in broken.stderr and "train.dump" in broken.stderr
    (pair, second, *_) = raw_pairs(l0[0])
    lost = {**pair, "generate": {**pair["generate"], "dump": str(tmp_path / "gone.json")}}
    write_raw([lost, second], str(tmp_path / "partial.jsonl"))
    partial = cli(str(tmp_path / "partial.jsonl"))
    assert partial.returncode == 1
    assert (
        f"pair {pair['pair']}: {Verdict.FAILED}: cannot read a dump" in partial.stdout and "gone.json" in partial.stdout
    )
    results = pandas.read_csv(tmp_path / "out" / "pairs.csv")
    assert list(results["verdict"]) == [Verdict.FAILED, Verdict.NO_DIVERGENCE]


def _scale(entry: dict, where: str, factor: float) -> None:
    """Scale the max, min and norm that msprobe recorded for one tensor of an entry ("output.0", "input.0")."""
    group, index = where.split(".")
    tensor = entry["output" if group == "output" else "input_args"][int(index)]
    for stat in ("Max", "Min", "Norm"):
        tensor[stat] *= factor


def factor_of(changed: list[tuple[str, str, float]]) -> float:
    return max(factor for _, _, factor in changed)


@pytest.mark.parametrize(
    ("changed", "expected"),
    [
        # (entry of the vLLM dump, tensor, factor): the earliest in model order must be named
        ([("model.embed_tokens.VocabParallelEmbedding", "output.0", 1.1)], "embed_tokens output"),
        (
            [("model.layers.0.self_attn.qkv_proj.QKVParallelLinear", "output.0", 1.03)],
            "layers.0.self_attn.qkv_proj output",
        ),
        (
            [("model.layers.3.mlp.down_proj.RowParallelLinear", "output.0", 1.5),
             ("model.layers.2.self_attn.o_proj.RowParallelLinear", "input.0", 1.05)],
            "layers.2.self_attn.o_proj input",
        ),
        ([("model.norm.RMSNorm", "output.0", 1.1)], "norm output"),
        # under the fixed threshold, a step up from fp32 noise all the same: the step rule names it
        ([("model.layers.1.mlp.down_proj.RowParallelLinear", "output.0", 1.01)], "layers.1.mlp.down_proj output"),
    ],
)  # fmt: skip
def test_the_first_divergence_in_model_order(l0, tmp_path, changed, expected):
    (pair, *_) = raw_pairs(l0[0])
    generate = json.loads(Path(pair["generate"]["dump"]).read_text())
    for module, where, factor in changed:
        _scale(generate["data"][f"Module.{module}.forward.0"], where, factor)
    (tmp_path / "gen.json").write_text(json.dumps(generate))
    write_raw([{**pair, "generate": {**pair["generate"], "dump": "gen.json"}}], str(tmp_path / "pairs.jsonl"))
    _, results, _ = run_compare(tmp_path / "pairs.jsonl", tmp_path / "report")
    result = results.iloc[0]
    assert result["verdict"] == Verdict.DIVERGES
    assert f"{result['first_module']} {result['first_io']}" == expected
    assert result["first_rule"] == "step"
    if factor_of(changed) < 1.02:  # the fixed threshold names nothing; the error is the change's
        assert pandas.isna(result["threshold_module"])
        assert result["first_error"] == pytest.approx(0.01 / 1.01, rel=1e-3)


RAY_CLUSTER = """
import sys
import ray

context = ray.init(num_cpus=2, include_dashboard=False)
print(context.address_info["gcs_address"], flush=True)
sys.stdin.read()  # until the test closes our stdin
ray.shutdown()
"""


def test_ray_runs_the_pairs_on_an_existing_cluster(l0, tmp_path, ray_tmp):
    from support.interpreter import clean_env

    # Ray 2.60 turns token authentication on for a new cluster; a second process would need its token.
    env = clean_env(RAY_TMPDIR=ray_tmp, RAY_AUTH_MODE="disabled")
    cluster = subprocess.Popen(
        [sys.executable, "-c", RAY_CLUSTER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        address = cluster.stdout.readline().strip()
        assert address, "the Ray cluster did not start"
        out = tmp_path / "report"
        command = [sys.executable, "-m", "msprobe_hooks", "compare", str(l0[0]), "-o", str(out), "--ray", address]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        results = pandas.read_csv(out / "pairs.csv")
        assert list(results["verdict"]) == [Verdict.NO_DIVERGENCE] * 4
        assert list(results["compared"]) == [COMPARED_PER_PAIR] * 4
    finally:
        cluster.stdin.close()
        cluster.wait(timeout=120)


def test_dump_file_streams_entries_as_json_load_reads_them(l0, tmp_path, monkeypatch):
    """Entry by entry through a tiny read buffer (every boundary case), the same as json.load; truncation named."""
    from msprobe_hooks.analysis import dumpfile

    (pair, *_) = raw_pairs(l0[0])
    path = pair["generate"]["dump"]
    whole = json.loads(Path(path).read_text())
    monkeypatch.setattr(dumpfile, "CHUNK", 7)
    streamed = {"data": {}}
    for key, value, is_entry in dumpfile.entries(path):
        (streamed["data"] if is_entry else streamed)[key] = value
    assert streamed == whole
    assert list(streamed["data"]) == list(whole["data"])  # model order kept
    truncated = tmp_path / "dump.json"
    truncated.write_text(Path(path).read_text()[:-200])
    with pytest.raises(dumpfile.DumpFileError, match=f"{truncated}: .*truncated"):
        list(dumpfile.entries(str(truncated)))
