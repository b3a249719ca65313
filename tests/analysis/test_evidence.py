"""What the engines recorded about themselves, read back by compare and diagnosed (docs/analysis.md, "What kind of
cause"): real pairs (the golden FSDP2 and vLLM trees: fp32, nothing diverging) given each side's ``engine.jsonl``,
the rollout's ``requests.jsonl`` and the training side's gap lines as the hooks' writers shape them. Each recorded
difference is named as its kind with its numbers; equal records, or a record on one side only, name nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from support import golden

from msprobe_hooks import numerics
from msprobe_hooks.analysis.answer.diagnosis import Evidence, Facts, SideEvidence, diagnose_facts
from msprobe_hooks.analysis.answer.evidence import TEMPERATURE
from msprobe_hooks.analysis.results import Cause, DiagnosisPath, FirstRule, PairResult, RowFacts, Verdict
from msprobe_hooks.analysis.run import CompareOptions, compare_file
from msprobe_hooks.cli import main
from msprobe_hooks.inference.evidence import request_line
from msprobe_hooks.join_keys import ENGINE_LOG, GAP_LOG, REQUESTS_LOG

VERDICT = golden.GOLDEN / "verdict"
CONFIG = {"model_type": "qwen2", "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
FP32 = {"model_dtype": "float32", "kv_cache_dtype": "float32", "head_dtype": "float32"}


def engine(side: str, numerics_: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """An engine.jsonl line: the inference side's as its writer builds it; the training side's keys as its own
    (training/engine_record.py: logits_dtype, param_dtype, ...)."""
    if side == "generate":
        return numerics.engine_record(
            side=side, engine="vllm", version="0", pid=1, rank=0, time=0.0, numerics=numerics_, model_config=config,
            fingerprint=numerics.config_fingerprint(config),
        )  # fmt: skip
    return {
        "side": side, "engine": "verl-fsdp", "version": "0", "pid": 1, "rank": 0, "time": 0.0, "numerics": numerics_,
        "model_config": config, "model_config_fingerprint": numerics.config_fingerprint(config),
    }  # fmt: skip


def compared(
    tmp_path: Path,
    *,
    rollout: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None,
    temperature: float | None = 1.0,
    prompts: dict[str, list[int]] | None = None,
    trained: dict[str, list[int]] | None = None,
    older: bool = False,
):
    """The golden pair trees with the evidence files in their process folders; compare's diagnosis."""
    train, generate = tmp_path / "actor", tmp_path / "generate"
    shutil.copytree(golden.GOLDEN / "fsdp2" / "actor", train)
    shutil.copytree(golden.GOLDEN / "vllm" / "generate", generate)
    (train_process,) = [p for p in train.iterdir() if p.name.isdigit()]
    (generate_process,) = [p for p in generate.iterdir() if p.name.isdigit()]
    if rollout is not None:
        (generate_process / ENGINE_LOG).write_text(json.dumps(rollout) + "\n")
    if training is not None:
        (train_process / ENGINE_LOG).write_text(json.dumps(training) + "\n")
    if sampling is not None:
        lines = [
            request_line(f"{key}-0123abcd", key, sampling, ids) for key, ids in (prompts or golden.PROMPTS).items()
        ]
        (generate_process / REQUESTS_LOG).write_text("\n".join(lines) + "\n")
    gaps = [
        {"request_id": key, "global_step": 1, "tokens": 2, "max": 0.0, "mean": 0.0, "temperature": temperature,
         "prompt_len": len(ids), "token_ids": [*(trained or {}).get(key, ids), 1, 2]}
        for key, ids in golden.PROMPTS.items()
    ]  # fmt: skip
    (train_process / GAP_LOG).write_text("".join(json.dumps(g) + "\n" for g in gaps))
    pairs = tmp_path / "pairs.jsonl"
    assert main(["align", str(train), str(generate), "-o", str(pairs)]) == 0
    if older:  # a pairs file of an older align: no side files named, found by the layout
        lines = [json.loads(line) for line in pairs.read_text().splitlines()]
        for line in lines:
            assert line["generate"].pop("engine_log").endswith(ENGINE_LOG)  # named by align, now taken out
            line["train"].pop("engine_log", None), line["generate"].pop("requests_log", None)
        pairs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return compare_file(str(pairs), str(tmp_path / "report"), CompareOptions(jobs=1)).answer.diagnosis


ROLLOUT = engine("generate", {**FP32, "logprobs_mode": "processed_logprobs"}, CONFIG)
TRAINING = engine("train", {"model_dtype": "float32", "logits_dtype": "float32"}, CONFIG)
PLAIN = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


def test_equal_records_on_both_sides_name_nothing(tmp_path):
    found = compared(tmp_path, rollout=ROLLOUT, training=TRAINING, sampling=PLAIN)
    assert (found.cause, found.module) == (Cause.NONE, None)
    assert not [e for e in found.evidence if e.startswith("not recorded")]


@pytest.mark.parametrize(
    ("mode", "sampling", "temperature", "line"),
    [
        # vLLM's processed log-probs are of logits / 0.8; verl recomputed with 1.0
        ("processed_logprobs", {**PLAIN, "temperature": 0.8}, 1.0, f"{TEMPERATURE} 0.8 (rollout) vs 1.0 (training)"),
        # the same temperature given to both, but vLLM's raw log-probs are of the logits undivided
        ("raw_logprobs", {**PLAIN, "temperature": 0.8}, 0.8, f"{TEMPERATURE} 1.0 (rollout) vs 0.8 (training)"),
        # a nucleus the rollout renormalised over, which training never replays
        ("processed_logprobs", {**PLAIN, "top_p": 0.9}, 1.0, "top_p 0.9 (rollout) vs 1.0 (training)"),
        # a top-k the rollout renormalised over; training keeps every logit (no top-k: "off", never "None")
        ("processed_logprobs", {**PLAIN, "top_k": 5}, 1.0, "top_k 5 (rollout) vs off (training)"),
    ],
)
def test_log_probs_made_differently_from_the_same_logits_are_sampling(tmp_path, mode, sampling, temperature, line):
    rollout = engine("generate", {**FP32, "logprobs_mode": mode}, CONFIG)
    found = compared(tmp_path, rollout=rollout, training=TRAINING, sampling=sampling, temperature=temperature)
    assert (found.cause, found.path) == (Cause.SAMPLING, DiagnosisPath.AFTER_LOGITS)
    assert found.evidence[0] == line
    assert any(e.startswith(f"the rollout returns {mode}") for e in found.evidence)


def test_a_pairs_file_of_an_older_align_finds_the_records_by_the_layout(tmp_path):
    sampling = {**PLAIN, "temperature": 0.8}
    found = compared(tmp_path, rollout=ROLLOUT, training=TRAINING, sampling=sampling, older=True)
    assert (found.cause, found.evidence[0]) == (Cause.SAMPLING, f"{TEMPERATURE} 0.8 (rollout) vs 1.0 (training)")


def test_the_same_temperature_divided_on_both_sides_is_not_sampling(tmp_path):
    found = compared(
        tmp_path, rollout=ROLLOUT, training=TRAINING, sampling={**PLAIN, "temperature": 0.8}, temperature=0.8
    )
    assert found.cause is Cause.NONE


def test_a_rope_theta_the_rollout_loaded_otherwise_is_configuration(tmp_path):
    rollout = engine("generate", {**FP32, "logprobs_mode": "raw_logprobs"}, {**CONFIG, "rope_theta": 500000.0})
    found = compared(tmp_path, rollout=rollout, training=TRAINING, sampling=PLAIN)
    assert (found.cause, found.path) == (Cause.CONFIGURATION, None)
    assert found.evidence[0] == "rope_theta 500000.0 (rollout) vs 10000.0 (training)"


@pytest.mark.parametrize(("theta", "cause"), [(10000.0, Cause.NONE), (1000000.0, Cause.CONFIGURATION)])
def test_transformers_5s_rope_parameters_meet_the_older_spelling(tmp_path, theta, cause):
    """The training venv's transformers may keep rope_theta in rope_parameters: compared with the other spelling."""
    newer = {k: v for k, v in CONFIG.items() if k != "rope_theta"} | {
        "rope_parameters": {"rope_theta": theta, "rope_type": "default"}
    }
    training = engine("train", {"model_dtype": "float32", "logits_dtype": "float32"}, newer)
    assert compared(tmp_path, rollout=ROLLOUT, training=training, sampling=PLAIN).cause is cause


def test_logits_in_another_dtype_with_every_module_agreeing_are_precision(tmp_path):
    training = engine("train", {"model_dtype": "float32", "logits_dtype": "bfloat16"}, CONFIG)
    found = compared(tmp_path, rollout=ROLLOUT, training=training, sampling=PLAIN)
    assert (found.cause, found.path, found.module) == (Cause.PRECISION, DiagnosisPath.AFTER_LOGITS, "lm_head")
    assert found.evidence[0].startswith("lm_head output float32 (rollout) vs bfloat16 (training)")


def test_a_whole_rollout_in_bf16_is_the_models_precision_not_its_logits(tmp_path):
    """vLLM in bf16 computes its logits in bf16 too (head_dtype defaults to the model's): fp32 training against it is
    the whole model's precision, every row in another dtype, and names no module, however its logits' dtypes differ
    (the golden fp32 training tree against vLLM bf16, each side's engine.jsonl as the real engines write it)."""
    train, generate = tmp_path / "actor", tmp_path / "generate"
    shutil.copytree(VERDICT / "actor", train)
    shutil.copytree(VERDICT / "bf16-clean" / "generate", generate)
    bf16 = {"model_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "head_dtype": "bfloat16"}
    for root, line in ((train, TRAINING), (generate, engine("generate", bf16, CONFIG))):
        (process,) = [p for p in root.iterdir() if p.name.isdigit()]
        (process / ENGINE_LOG).write_text(json.dumps(line) + "\n")
    pairs = tmp_path / "pairs.jsonl"
    assert main(["align", str(train), str(generate), "-o", str(pairs)]) == 0
    found = compare_file(str(pairs), str(tmp_path / "report"), CompareOptions(jobs=1)).answer.diagnosis
    assert (found.cause, found.path, found.module) == (Cause.PRECISION, None, None)
    assert found.evidence[0] == "model dtype float32 (training) vs bfloat16 (rollout) on 100% of the compared rows"


def test_a_prompt_tokenized_otherwise_under_the_same_request_id_is_inputs(tmp_path):
    trained = {**golden.PROMPTS, "req-0": [5, 17, 42, 872, 77, 23]}
    found = compared(tmp_path, rollout=ROLLOUT, training=TRAINING, sampling=PLAIN, trained=trained)
    assert found.cause is Cause.INPUTS
    assert found.evidence[0] == "token ids differ from position 3: 9 (rollout) vs 872 (training) in request req-0"
    assert found.line == f"cause: inputs: the two sides were fed different token ids: {found.evidence[0]}; every " + (
        "module downstream inherits it"
    )


def test_evidence_one_side_did_not_record_decides_nothing(tmp_path):
    rollout = engine("generate", {**FP32, "logprobs_mode": "raw_logprobs"}, {**CONFIG, "rope_theta": 500000.0})
    found = compared(tmp_path, rollout=rollout, sampling=PLAIN)  # no training engine.jsonl (an older dump)
    assert found.cause is Cause.NONE
    assert "not recorded: the engines' model configurations (training)" in found.evidence


# --- the rollout's KV cache: on Facts (no golden pair of this kind) --------------------------------------------


def _attention_step(module: str) -> PairResult:
    name, io = module.split()
    return PairResult(
        pair=0, key="req-0", compared=10, verdict=Verdict.DIVERGES, max_error=0.05, max_module=name, global_step=1,
        first_rule=FirstRule.STEP, first_module=name, first_io=io, first_error=0.05, first_before=1e-6, first_order=9,
        row_facts=RowFacts({("torch.bfloat16", "torch.bfloat16"): 10}),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("cache", "module", "cause"),
    [
        ("fp8_e4m3", "layers.0.self_attn.attn output", Cause.PRECISION),
        ("fp8_e4m3", "layers.0.self_attn.o_proj input", Cause.PRECISION),
        ("bfloat16", "layers.0.self_attn.attn output", Cause.MODULE),  # a cache in the model's dtype: the kernel's
        ("fp8_e4m3", "layers.0.mlp.down_proj output", Cause.MODULE),  # another module steps first
    ],
)
def test_an_fp8_kv_cache_is_precision_where_the_attention_reading_it_steps_up(cache, module, cause):
    rollout = SideEvidence(numerics={"model_dtype": "bfloat16", "kv_cache_dtype": cache})
    found = diagnose_facts(Facts([_attention_step(module)], evidence=Evidence(rollout=rollout)))
    assert found.cause is cause
    if cause is Cause.PRECISION:
        assert found.evidence[0] == "KV cache fp8_e4m3 (rollout; its model computes in bfloat16, engine.jsonl)"
