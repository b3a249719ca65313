"""Real Megatron <-> vLLM pairs (golden trees ``tests/golden/megatron``): the name map, the verdict, the stages.

verl's real Megatron engine (bf16, the local layer spec) dumped the demo's four prompts at TP 1 and TP 2;
vLLM's CPU engine the same prompts from the same HF folder in fp32 and bf16, and from the demo's copy
with ``layers.1.mlp.down_proj`` x1.05 (``scripts/make_golden.py --only megatron``). A pipeline stage is the
TP 1 tree as the last of two stages dumps it (its layers renamed from 0, the earlier ones and the
embedding gone: the layout a real PP 2 run dumps, ``test_real_megatron.py``), with its ``layer_offset``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas
import pytest
from support import golden

from msprobe_hooks.analysis.pairing import pairs
from msprobe_hooks.analysis.pairing.pairs import RankRule
from msprobe_hooks.analysis.results import Status, Verdict
from msprobe_hooks.cli import main

MEGATRON = golden.GOLDEN / "megatron"
PLANTED = "layers.1.mlp.down_proj"
PROMPT_LENS = (6, 9, 5, 8)  # cpu_kit.demo_inputs'
# Per decoder layer the 19 activations of a Qwen2 pair (two norms in and out, qkv, o_proj, attention,
# self-attention, gate_up, act_fn, down_proj, mlp, the layer's output), 4 layers, the embedding, the final norm.
COMPARED_PER_PAIR = 19 * 4 + 4


def compare(tmp_path: Path, train: Path, generate: Path, *extra: str) -> tuple[pandas.DataFrame, pandas.DataFrame]:
    pairs_file, report = tmp_path / "pairs.jsonl", tmp_path / "report"
    assert main(["align", str(train), str(generate), "-o", str(pairs_file), "--backend", "megatron", *extra]) == 0
    status = main(["compare", str(pairs_file), "-o", str(report), "--jobs", "1"])
    assert status in (0, 1)
    results = pandas.read_csv(report / "pairs.csv", keep_default_na=False)
    return results, pandas.read_csv(report / "modules.csv", keep_default_na=False)


@pytest.mark.parametrize("inference", ["vllm", "vllm_bf16"])
def test_same_weights_compare_every_activation_and_name_nothing(tmp_path, inference):
    found, rows = compare(tmp_path, MEGATRON / "tp1/actor", MEGATRON / inference / "generate")
    assert sorted(found["key"]) == [f"req-{i}" for i in range(4)]
    assert set(found["verdict"]) == {Verdict.NO_DIVERGENCE.value}
    # Every Megatron activation with an inference counterpart compared: the embedding output and the residual
    # stream (TransformerBlock, TransformerLayer) included; nothing left unmatched for want of a rule.
    assert list(found["compared"]) == [COMPARED_PER_PAIR] * 4 and set(found["unmatched"]) == {0}
    compared = rows[rows["status"] == Status.COMPARED.value]
    assert {"embed_tokens", "layers.3", "norm"} <= set(compared["module"])
    # bf16 Megatron against vLLM: the noise (measured up to 1.2e-2 against fp32, 1.7e-2 against bf16) is never a
    # step up of 2x, and stays under the fixed 2e-2.
    assert compared["error"].astype(float).max() < 2e-2
    for reason in rows[rows["status"] == Status.NOT_COMPARABLE.value]["reason"]:
        assert reason, "a not-comparable row without its reason"


def test_a_planted_fault_is_named_at_its_module(tmp_path):
    found, _ = compare(tmp_path, MEGATRON / "tp1/actor", MEGATRON / "vllm_perturbed/generate")
    assert set(found["verdict"]) == {Verdict.DIVERGES.value}
    assert set(found["first_module"] + " " + found["first_io"]) == {f"{PLANTED} output"}
    assert set(found["first_rule"]) == {"step"}


def test_tensor_parallel_2_pads_odd_prompts_which_statistics_cannot_cut(tmp_path):
    # verl pads every BSHD sequence to a multiple of the TP size: the 9- and 5-token prompts are dumped as 10
    # and 6 tokens. Their statistics hold the pad row: not comparable, said so; the others compare on rank 0.
    found, _ = compare(tmp_path, MEGATRON / "tp2/actor", MEGATRON / "vllm/generate")
    by_key = found.set_index("key")
    for key, length in zip(by_key.index, PROMPT_LENS, strict=True):
        verdict = by_key.loc[key, "verdict"]
        if length % 2:
            assert verdict == Verdict.STATISTICS.value
            assert "padded to a multiple of TP" in by_key.loc[key, "message"]
        else:
            assert verdict == Verdict.NO_DIVERGENCE.value


def _last_stage(tmp_path: Path, offset: int, log_offset: bool = True) -> Path:
    """The TP 1 tree as the last pipeline stage from layer ``offset`` dumps it."""
    root = tmp_path / "stage"
    golden_copy = golden.copy("megatron/tp1", tmp_path)
    (golden_copy / "actor").rename(root)
    before = re.compile(r"\.(embedding|rotary_pos_emb)\.")
    layer = re.compile(r"\.decoder\.layers\.(\d+)\.")
    for path in golden.dumps(root):
        data = json.loads(path.read_text())
        kept = {}
        for name, entry in data["data"].items():
            found = layer.search(name)
            if before.search(name) or (found and int(found.group(1)) < offset):
                continue  # computed on an earlier stage
            if found:
                name = name.replace(found.group(0), f".decoder.layers.{int(found.group(1)) - offset}.")
            kept[name] = entry
        data["data"] = kept
        path.write_text(json.dumps(data))
    (log,) = root.glob("*/update_actor_log.jsonl")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for line in lines:
        line["layer_offset"] = offset if log_offset else 0
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


def test_a_pipeline_stage_is_compared_as_the_models_layers(tmp_path):
    stage = _last_stage(tmp_path, offset=2)
    generate = golden.copy("megatron/vllm", tmp_path) / "generate"
    golden.scale_output(generate, "layers.3.mlp.down_proj", 1.05)  # a fault of known place on the stage
    found, rows = compare(tmp_path, stage, generate)
    assert set(found["verdict"]) == {Verdict.DIVERGES.value}
    assert set(found["first_module"] + " " + found["first_io"]) == {"layers.3.mlp.down_proj output"}
    assert set(found["unmatched"]) == {0}
    earlier = rows[rows["reason"].str.startswith("on an earlier pipeline stage")]
    assert set(earlier["status"]) == {Status.NOT_COMPARABLE.value}
    assert {m.split(".")[0] for m in earlier["module"]} == {"embed_tokens", "layers"}
    assert {int(m.split(".")[1]) for m in earlier["module"] if m.startswith("layers.")} == {0, 1}
    # The stage's own tensors that compare with nothing (its weights, ...) are filed under the model's layers too.
    stage_rows = rows[rows["train_name"].fillna("").str.contains("decoder.layers.")]
    assert {int(float(layer)) for layer in stage_rows["layer"] if layer != ""} == {2, 3}


def test_without_its_offset_a_stage_would_be_compared_against_the_wrong_layers(tmp_path):
    found, _ = compare(tmp_path, _last_stage(tmp_path, offset=2, log_offset=False), MEGATRON / "vllm/generate")
    # Layer 2 against vLLM's layer 0: the very first comparison is off by far more than noise.
    assert set(found["verdict"]) == {Verdict.DIVERGES.value}
    assert set(found["first_module"].str.split(".").str[:2].str.join(".")) == {"layers.0"}


def test_tensor_parallel_2_meets_tensor_parallel_2_rank_by_rank(tmp_path):
    # Megatron TP 2 against vLLM TP 2: each rank's shards against the inference rank sharded alike.
    found, rows = compare(tmp_path, MEGATRON / "tp2/actor", MEGATRON / "vllm_tp2/generate")
    lines = list(pairs.read(str(tmp_path / "pairs.jsonl")))
    assert sorted((p.key, p.train.rank, p.generate.rank) for p in lines) == [
        (f"req-{i}", rank, rank) for i in range(4) for rank in (0, 1)
    ]
    assert {p.rank_rule for p in lines} == {RankRule.SAME}
    even = found[found["key"].isin(["req-0", "req-3"])]  # the odd prompts are padded (the test above)
    assert set(even["verdict"]) == {Verdict.NO_DIVERGENCE.value}
    # (blank counts where a padded pair compared nothing: the columns read as text)
    assert list(even["compared"].astype(float)) == [COMPARED_PER_PAIR] * 4
    assert set(even["unmatched"].astype(float)) == {0}
    sharded = rows[rows["reason"].str.contains("tensor.parallel", regex=True)]
    assert sharded.empty, sharded[["module", "reason"]].to_string()
