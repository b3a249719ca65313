"""What kind of cause (``analysis/answer/diagnosis.py``): each rule on the golden trees that prove it, the
evidence one side lacks, ``diagnosis.json``, the cause line and ``compare --fail-on`` (docs/analysis.md, "What kind
of cause")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import golden

from msprobe_hooks.analysis.answer import diagnosis
from msprobe_hooks.analysis.answer.diagnosis import DEFAULT_RULES, Evidence, Facts, SideEvidence, diagnose_facts
from msprobe_hooks.analysis.results import Cause, DiagnosisPath, FirstRule, PairResult, RowFacts, Verdict
from msprobe_hooks.analysis.run import Compared, CompareOptions, compare_file
from msprobe_hooks.cli import main

GOLDEN = golden.GOLDEN
VERDICT, MOE, MEGATRON = GOLDEN / "verdict", GOLDEN / "moe", GOLDEN / "megatron"
MAIN_PPO = GOLDEN / "main_ppo"
SGLANG_LOOP = GOLDEN / "sglang_loop"
LOGITS_LOOP = GOLDEN / "logits_loop"
RECORD_KEYS = ["cause", "path", "module", "global_step", "evidence", "sentence"]


def compared(tmp_path: Path, train: Path, generate: Path, *align: str) -> Compared:
    found = tmp_path / "pairs.jsonl"
    assert main(["align", str(train), str(generate), "-o", str(found), *align]) == 0
    return compare_file(str(found), str(tmp_path / "report"), CompareOptions(jobs=1))


def test_fp32_on_both_sides_with_nothing_diverging_is_none(tmp_path):
    found = compared(tmp_path, VERDICT / "actor", VERDICT / "fp32-clean" / "generate").answer.diagnosis
    assert (found.cause, found.path, found.module) == (Cause.NONE, None, None)
    assert "floor 0.0001 (4 x unit roundoff of float32)" in found.evidence[1]
    # No ids recorded here: the embedding's input speaks only for what msprobe's statistics of ids hold
    assert found.evidence[-1] == (
        "token ids compared through embed_tokens input: equal in 4 of 4 pairs "
        "(4 by their max and min only: a changed id between them is not seen)"
    )


def test_fp32_training_against_bf16_vllm_is_the_models_precision(tmp_path):
    found = compared(tmp_path, VERDICT / "actor", VERDICT / "bf16-clean" / "generate").answer.diagnosis
    assert (found.cause, found.path, found.module) == (Cause.PRECISION, None, None)
    assert found.evidence[0] == "model dtype float32 (training) vs bfloat16 (rollout) on 100% of the compared rows"
    assert found.evidence[1].startswith("every error within the bfloat16 floor: largest 0.0113")


# verl's own main_ppo with one real setting of its configuration each (tests/golden/README.md, main_ppo/):
# case: (cause, path, the first evidence line: what decided it)
MAIN_PPO_CASES = {
    # model_dtype=fp32 with FSDP's mixed precision at verl's default (a bf16 forward) against vLLM in fp32: every
    # compared row differs in dtype, the logits among them: the whole model's precision, not the logits'
    "bf16_forward": (
        Cause.PRECISION,
        None,
        "model dtype bfloat16 (training) vs float32 (rollout) on 100% of the compared rows",
    ),
    # bf16 on both sides, nothing planted: errors up to 1.25e-2, the floor's noise, no module named
    "bf16": (Cause.NOISE, None, "model dtype bfloat16 on both sides on 100% of the compared rows"),
    # the rollout's raw log-probs while it samples at 0.8, which verl divides the recomputed logits by
    "bf16_raw_logprobs": (
        Cause.SAMPLING,
        DiagnosisPath.AFTER_LOGITS,
        "log-probs temperature 1.0 (rollout) vs 0.8 (training)",
    ),
    # a nucleus the rollout renormalises over and training never replays
    "top_p": (Cause.SAMPLING, DiagnosisPath.AFTER_LOGITS, "top_p 0.7 (rollout) vs 1.0 (training)"),
}


@pytest.mark.parametrize("case", list(MAIN_PPO_CASES))
def test_main_ppo_with_a_real_setting_of_verls_configuration_names_its_kind(tmp_path, case):
    cause, path, decided_by = MAIN_PPO_CASES[case]
    found = compared(tmp_path, MAIN_PPO / case / "actor", MAIN_PPO / case / "generate").answer.diagnosis
    assert (found.cause, found.path, found.module) == (cause, path, None)
    assert found.evidence[0] == decided_by


# SGLang rolling out at temperature 0.8, verl recomputing at 0.8 (tests/golden/README.md, sglang_loop/): what SGLang
# returns is its sampler's choice, read from SGLang's own module. case: (cause, path, the first evidence line)
SGLANG_LOOP_CASES = {
    # its default, log_softmax(logits / T): what verl recomputes
    "tempered": (Cause.NONE, None, "model dtype float32 on both sides"),
    # SGLANG_RETURN_ORIGINAL_LOGPROB=1: the raw logits' log-probs against verl's tempered ones
    "raw_logprobs": (
        Cause.SAMPLING,
        DiagnosisPath.AFTER_LOGITS,
        "log-probs temperature 1.0 (rollout) vs 0.8 (training)",
    ),
}


# The CPU kit's RL loop in tensor mode, the rollout sampled at 0.8 (tests/golden/README.md, logits_loop/): each
# side's log-probs read from the rollout's own logits at its sampling steps, 22 response tokens (4 prompts packed).
# case: (cause, what the rollout's log-probs equal, what training's equal)
TEMPERED, RAW = "log_softmax(logits / 0.8)", "log_softmax(logits)"
LOGITS_LOOP_CASES = {
    "tempered": (Cause.SAMPLING, TEMPERED, RAW),  # processed_logprobs; the trainer given 1.0
    "top_p": (Cause.SAMPLING, f"{TEMPERED} over top-p 0.7", TEMPERED),  # a nucleus training never replays
    "raw": (Cause.SAMPLING, RAW, TEMPERED),  # vLLM's raw_logprobs; the trainer divides by 0.8
    "sglang_raw": (Cause.SAMPLING, RAW, TEMPERED),  # SGLang under SGLANG_RETURN_ORIGINAL_LOGPROB=1
    "alike": (Cause.NONE, TEMPERED, TEMPERED),  # processed_logprobs; the trainer at 0.8 too
}
LOGITS_TOKENS = 22


def logits_lines(found) -> list[str]:
    return [e for e in found.evidence if "log-probs equal" in e or "log-probs are off" in e or "made into" in e]


@pytest.mark.parametrize("case", list(LOGITS_LOOP_CASES))
def test_each_sides_log_probs_are_read_from_the_rollouts_own_logits(tmp_path, case):
    cause, rollout, training = LOGITS_LOOP_CASES[case]
    tree = LOGITS_LOOP / case
    found = compared(tmp_path, tree / "actor", tree / "generate").answer.diagnosis
    assert found.cause is cause, found.evidence
    assert found.path is (DiagnosisPath.AFTER_LOGITS if cause is Cause.SAMPLING else None)
    lines = logits_lines(found)
    checked = f"on all {LOGITS_TOKENS} response tokens checked"
    assert lines[0].startswith(f"the rollout's log-probs equal {rollout} to ") and checked in lines[0], lines
    assert lines[1].startswith(f"training's recomputed log-probs equal {training} to ") and checked in lines[1], lines
    assert lines[1].endswith("the two engines' logits agree")
    # made two ways: the rollout's off training's transform by the gap itself, far beyond fp32 rounding
    assert (len(lines) == 3) == (cause is Cause.SAMPLING), lines
    if cause is Cause.SAMPLING:
        assert lines[2].startswith(f"the rollout's are off {training} by up to 0.")


def test_the_rollouts_values_decide_sampling_where_its_parameters_were_not_recorded(tmp_path):
    tree = golden.copy("logits_loop/tempered", tmp_path)
    (requests,) = (tree / "generate").glob("*/requests.jsonl")
    requests.unlink()  # an older rollout, or one that died before writing it
    found = compared(tmp_path, tree / "actor", tree / "generate").answer.diagnosis
    assert (found.cause, found.path) == (Cause.SAMPLING, DiagnosisPath.AFTER_LOGITS)
    # only the transforms both sides' own values allow were tried: the rollout's matches none, training's the raw one
    assert found.sentence.startswith(
        f"the modules agree; the log-probs are made differently from the logits: the rollout's log-probs equal none of "
        f"{RAW}: closest {RAW} to 0.1"
    ), found.sentence
    assert "its sampling parameters not recorded (requests.jsonl)" in found.sentence
    assert "not recorded: the sampling parameters (rollout)" in found.evidence


def test_the_engines_values_outweigh_a_recorded_parameter_that_changes_nothing_returned(tmp_path):
    """Both sides' values equal log_softmax(logits / 0.8) of one logits: a top-p recorded in the rollout's requests
    (as if its sampler had ignored it) changes nothing they returned, so nothing is named."""
    tree = golden.copy("logits_loop/alike", tmp_path)
    (requests,) = (tree / "generate").glob("*/requests.jsonl")
    lines = [json.loads(line) for line in requests.read_text().splitlines()]
    for line in lines:
        line["sampling"]["top_p"] = 0.5
    requests.write_text("".join(json.dumps(line) + "\n" for line in lines))
    found = compared(tmp_path, tree / "actor", tree / "generate").answer.diagnosis
    assert found.cause is Cause.NONE, found.evidence
    assert any(e.startswith(f"the rollout's log-probs equal {TEMPERED} to ") for e in found.evidence)


def test_without_per_token_log_probs_the_recorded_parameters_decide_and_the_logits_are_said_unchecked(tmp_path):
    tree = golden.copy("logits_loop/tempered", tmp_path)
    (gaps,) = (tree / "actor").glob("*/logprob_gap.jsonl")
    lines = [json.loads(line) for line in gaps.read_text().splitlines()]
    for line in lines:  # MSPROBE_HOOKS_GAP_TOKENS=none
        for name in ("token_ids", "log_probs", "rollout_log_probs"):
            del line[name]
    gaps.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = compared(tmp_path, tree / "actor", tree / "generate")
    found = result.answer.diagnosis
    assert (found.cause, found.path) == (Cause.SAMPLING, DiagnosisPath.AFTER_LOGITS)
    assert found.evidence[0] == "log-probs temperature 0.8 (rollout) vs 1.0 (training)"
    assert not logits_lines(found)
    assert result.answer.logits is not None
    assert dict(result.answer.logits.not_checked) == {
        "its gap line holds no per-token log-probs (MSPROBE_HOOKS_GAP_TOKENS)": LOGITS_TOKENS
    }


@pytest.mark.parametrize(
    ("vocab_size", "why"),
    [
        (256, "the rollout's logits hold 128 columns, its vocabulary 256 (a shard?)"),  # a TP rank's slice of them
        (None, "the rollout's vocabulary size is not recorded (engine.jsonl): a logits row cannot be told whole"),
    ],
)
def test_a_logits_row_narrower_than_the_vocabulary_or_of_no_recorded_width_is_never_read(tmp_path, vocab_size, why):
    """A slice of the logits would give log-softmaxes over part of the vocabulary: every value off, a cause made up."""
    tree = golden.copy("logits_loop/tempered", tmp_path)
    (engine,) = (tree / "generate").glob("*/engine.jsonl")
    record = json.loads(engine.read_text())
    record["model_config"]["vocab_size"] = vocab_size
    if vocab_size is None:
        del record["model_config"]["vocab_size"]
    engine.write_text(json.dumps(record) + "\n")
    answer = compared(tmp_path, tree / "actor", tree / "generate").answer
    assert answer.logits is not None and not answer.logits.tokens
    assert dict(answer.logits.not_checked) == {why: LOGITS_TOKENS}
    assert not logits_lines(answer.diagnosis)  # (a vocabulary of 256 against training's 128 is a configuration)


def test_a_transform_within_the_logits_noise_is_left_to_the_recorded_parameters(tmp_path):
    """Training's values as a large bf16 model's: off their transform of the rollout's logits by 0.3, more than the
    temperature's 0.115 moves the rollout's. The values cannot tell the transform from the noise: never "alike", never
    "two ways"; the recorded temperatures decide."""
    tree = golden.copy("logits_loop/tempered", tmp_path)
    (gaps,) = (tree / "actor").glob("*/logprob_gap.jsonl")
    lines = [json.loads(line) for line in gaps.read_text().splitlines()]
    for line in lines:
        line["log_probs"] = [v + (0.3 if i % 2 else -0.3) for i, v in enumerate(line["log_probs"])]
    gaps.write_text("".join(json.dumps(line) + "\n" for line in lines))
    found = compared(tmp_path, tree / "actor", tree / "generate").answer.diagnosis
    assert (found.cause, found.path) == (Cause.SAMPLING, DiagnosisPath.AFTER_LOGITS)
    assert found.evidence[0] == "log-probs temperature 0.8 (rollout) vs 1.0 (training)"
    assert any(e.startswith(f"the rollout's log-probs equal {TEMPERED} to ") for e in found.evidence)
    assert any(
        e.startswith(f"training's recomputed log-probs are off {RAW} of the rollout's logits by up to 0.3")
        for e in found.evidence
    ), found.evidence
    assert not any("two ways" in e for e in found.evidence)


def test_a_prefill_step_of_other_tokens_than_the_prompt_is_not_read_as_its_first_token(tmp_path):
    """A chunk of a prompt, or a prompt recomputed with its first tokens after a preemption, samples no token 0."""
    tree = LOGITS_LOOP / "tempered"
    found = tmp_path / "pairs.jsonl"
    assert main(["align", str(tree / "actor"), str(tree / "generate"), "-o", str(found)]) == 0
    lines = [json.loads(line) for line in found.read_text().splitlines()]
    prefills = [line for line in lines if line["kind"] == "prefill"]
    for line in prefills:
        line["generate"]["tokens"] += 3  # as a recomputed request's row: its prompt and 3 generated tokens
    found.write_text("".join(json.dumps(line) + "\n" for line in lines))
    answer = compare_file(str(found), str(tmp_path / "report"), CompareOptions(jobs=1)).answer
    assert answer.logits is not None
    assert sorted({t.token_index for t in answer.logits.tokens}) == list(range(1, 7))  # the decode pairs' tokens
    why = "its prefill step held other tokens than the prompt's (chunked, or recomputed after a preemption)"
    assert dict(answer.logits.not_checked) == {why: len(prefills)}


def test_a_pairs_file_of_an_older_align_leaves_a_packed_steps_logits_unchecked(tmp_path):
    """Without ``request_index`` a step of four requests' logits cannot be told apart: never a row guessed."""
    tree = LOGITS_LOOP / "tempered"
    found = tmp_path / "pairs.jsonl"
    assert main(["align", str(tree / "actor"), str(tree / "generate"), "-o", str(found)]) == 0
    lines = [json.loads(line) for line in found.read_text().splitlines()]
    for line in lines:
        del line["generate"]["request_index"]
    found.write_text("".join(json.dumps(line) + "\n" for line in lines))
    answer = compare_file(str(found), str(tmp_path / "report"), CompareOptions(jobs=1)).answer
    assert answer.logits is not None
    older = "the pairs file does not say the request's place in its step (an older align)"
    # the last step held one request (the longest response): its one row is that request's
    assert [(t.key, t.token_index) for t in answer.logits.tokens] == [("g1-req-3", 6)]
    assert dict(answer.logits.not_checked) == {older: LOGITS_TOKENS - 1}
    assert answer.diagnosis.cause is Cause.SAMPLING
    assert f"logits not checked for {LOGITS_TOKENS - 1} pairs: {older}" in answer.diagnosis.evidence


@pytest.mark.parametrize("case", list(SGLANG_LOOP_CASES))
def test_what_sglang_returns_against_verls_recompute_decides_sampling(tmp_path, case):
    cause, path, decided_by = SGLANG_LOOP_CASES[case]
    found = compared(tmp_path, SGLANG_LOOP / case / "actor", SGLANG_LOOP / case / "generate").answer.diagnosis
    assert (found.cause, found.path, found.module) == (cause, path, None)
    assert found.evidence[0] == decided_by


def test_bf16_on_both_sides_is_noise_and_names_no_module(tmp_path):
    """bf16 Megatron against vLLM in bf16: errors up to 1.7e-2, over the 1.56e-2 floor, and no step up."""
    found = compared(
        tmp_path, MEGATRON / "tp1" / "actor", MEGATRON / "vllm_bf16" / "generate", "--backend", "megatron"
    ).answer.diagnosis
    assert (found.cause, found.path, found.module) == (Cause.NOISE, None, None)
    assert found.evidence[0] == "model dtype bfloat16 on both sides on 100% of the compared rows"
    assert found.evidence[1].startswith("errors grow smoothly: largest 0.0168")


# case: (training tree, inference tree, the module the step rule names)
PLANTED = {
    "fp32 up_proj x1.01": (VERDICT / "actor", VERDICT / "fp32-up_proj-1.01" / "generate", "layers.1.mlp.gate_up_proj"),
    "bf16 q_proj x1.05": (VERDICT / "actor", VERDICT / "bf16-q_proj-1.05" / "generate", "layers.2.self_attn.qkv_proj"),
    "vllm_perturbed": (GOLDEN / "fsdp2" / "actor", GOLDEN / "vllm_perturbed" / "generate", "layers.1.mlp.down_proj"),
}


@pytest.mark.parametrize("case", list(PLANTED))
def test_a_planted_weight_is_a_module_on_the_prefill_path(tmp_path, case):
    train, generate, module = PLANTED[case]
    found = compared(tmp_path, train, generate).answer.diagnosis
    assert (found.cause, found.path, found.module, found.global_step) == (
        Cause.MODULE,
        DiagnosisPath.PREFILL,
        module,
        1,
    )
    assert f"{module} output steps up to" in found.evidence[0]


def test_a_decode_only_fault_is_a_module_on_the_decode_path(tmp_path):
    copy = golden.copy("decode", tmp_path)
    (dump,) = copy.glob("vllm/*/step2/rank0/dump.json")
    golden.scale_rows(dump, "layers.1.mlp.down_proj", (1, 2), 1.05)  # req-1's decode row (test_decode's)
    found = compared(tmp_path, copy / "actor", copy / "vllm").answer.diagnosis
    assert (found.cause, found.path, found.module) == (Cause.MODULE, DiagnosisPath.DECODE, "layers.1.mlp.down_proj")
    assert any(
        line.startswith("decode tokens only: 3 prefill pairs compared, none diverges") for line in found.evidence
    )


def test_a_router_fault_is_routing_at_its_router(tmp_path):
    found = compared(tmp_path, MOE / "actor", MOE / "router" / "generate").answer.diagnosis
    layer = json.loads((MOE / "router_fault.json").read_text())["layer"]
    assert (found.cause, found.path, found.module) == (Cause.ROUTING, DiagnosisPath.PREFILL, f"layers.{layer}.mlp.gate")
    assert found.evidence[0].startswith(f"pair 0 (req-0): 3 of 6 tokens (50.0%) at layer {layer} go to other experts")


def test_bf16_moe_with_no_fault_blames_no_module_and_no_router(tmp_path):
    """fp32 training against vLLM's bf16 MoE: the model's precision, as for the dense model."""
    found = compared(tmp_path, MOE / "actor", MOE / "bf16" / "generate").answer.diagnosis
    assert (found.cause, found.module) == (Cause.PRECISION, None)


def test_a_stale_weight_from_global_step_2_is_a_module_since_that_step(tmp_path):
    train, generate = golden.two_step_run(tmp_path, ids=True, times=True)
    (pid,) = generate.glob("*")
    for step in range(4, 8):  # global step 2's rollout (test_run's stale layer-1 down_proj: far below 2e-2)
        golden.scale_output(pid / f"step{step}", "layers.1.mlp.down_proj", 1.004)
    found = compared(tmp_path, train, generate).answer.diagnosis
    assert (found.cause, found.path, found.module, found.global_step) == (
        Cause.MODULE,
        DiagnosisPath.PREFILL,
        "layers.1.mlp.down_proj",
        2,
    )
    assert "global step 2 is the first to diverge; 1 compared steps before it clean" in found.evidence
    assert found.sentence.endswith("from global step 2 on")


# --- the report: diagnosis.json, the first line, --fail-on ---------------------------------------------------------


def test_diagnosis_json_and_the_cause_line_opening_every_report(tmp_path, capsys):
    pairs_file, report = tmp_path / "pairs.jsonl", tmp_path / "report"
    assert (
        main(["align", str(VERDICT / "actor"), str(VERDICT / "fp32-up_proj-1.01" / "generate"), "-o", str(pairs_file)])
        == 0
    )
    capsys.readouterr()
    assert main(["compare", str(pairs_file), "-o", str(report), "--jobs", "1"]) == 0
    printed = capsys.readouterr().out.splitlines()
    record = json.loads((report / "diagnosis.json").read_text())
    assert list(record) == RECORD_KEYS
    assert (record["cause"], record["path"], record["module"], record["global_step"]) == (
        "module",
        "prefill",
        "layers.1.mlp.gate_up_proj",
        1,
    )
    assert isinstance(record["evidence"], list) and all(isinstance(e, str) for e in record["evidence"])
    line = f"cause: module (prefill): {record['sentence']}"
    assert printed[0] == line
    assert (report / "summary.md").read_text().split("\n\n")[:2] == ["# compare: 4 pairs", f"**{line}**"]
    page = (report / "index.html").read_text()
    assert page.split("</h1>\n", 1)[1].startswith(f"<p><strong>{line}</strong></p>")
    assert sum(p.startswith("cause:") for p in printed) == 1


def test_a_cause_without_a_path_leaves_the_parenthesis_out():
    found = diagnosis.Diagnosis(Cause.NOISE, sentence="s")
    assert found.line == "cause: noise: s"
    assert found.record()["path"] is None


@pytest.mark.parametrize(("fail_on", "status"), [("module", 1), ("precision,noise", 0)])
def test_fail_on_exits_1_when_the_diagnosis_is_one_of_its_causes(tmp_path, fail_on, status):
    pairs_file = tmp_path / "pairs.jsonl"
    assert (
        main(
            [
                "align",
                str(GOLDEN / "fsdp2" / "actor"),
                str(GOLDEN / "vllm_perturbed" / "generate"),
                "-o",
                str(pairs_file),
            ]
        )
        == 0
    )
    assert main(["compare", str(pairs_file), "-o", str(tmp_path / "r"), "--jobs", "1", "--fail-on", fail_on]) == status


def test_fail_on_an_unknown_cause_is_refused_at_start_up(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["compare", str(tmp_path / "nowhere.jsonl"), "--fail-on", "module,wrong"])
    assert exited.value.code == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "--fail-on" in x and "accepted" in x]
    assert "'module,wrong': wrong is not a cause; accepted: " + ", ".join(c.value for c in Cause) in line


# --- the rules on Facts: evidence one side lacks is "not recorded", never a cause ----------------------------------


def pair(**fields) -> PairResult:
    """A compared pair of a float32 model with nothing diverging, unless ``fields`` say otherwise."""
    base = {
        "pair": 0,
        "key": "req-0",
        "compared": 10,
        "verdict": Verdict.NO_DIVERGENCE,
        "max_error": 1e-6,
        "max_module": "layers.0 output",
        "global_step": 1,
        "row_facts": RowFacts({("torch.float32", "torch.float32"): 10}, {}, {"embed_tokens input": 0.0}),
    }
    return PairResult(**{**base, **fields})


def stepped(module: str = "lm_head output", **fields) -> PairResult:
    name, io = module.split()
    return pair(
        verdict=Verdict.DIVERGES,
        first_rule=FirstRule.STEP,
        first_module=name,
        first_io=io,
        first_error=0.05,
        first_before=1e-6,
        first_order=90,
        **fields,
    )


ROLLOUT_ONLY = {
    "configuration": SideEvidence(configuration={"rope_theta": 500000}),
    "sampling": SideEvidence(sampling={"temperature": 0.8}),
    "token_ids": SideEvidence(token_ids={"req-0": [1, 2, 3]}),
}


@pytest.mark.parametrize("field", list(ROLLOUT_ONLY))
def test_evidence_on_one_side_only_is_not_recorded_and_decides_nothing(field):
    facts = Facts([pair()], evidence=Evidence(rollout=ROLLOUT_ONLY[field]))
    found = diagnose_facts(facts)
    assert found.cause is Cause.NONE
    assert f"not recorded: {diagnosis.RECORDED[field]} (training)" in found.evidence


BOTH_SIDES = {  # field: (training, rollout, the cause, the evidence line)
    "configuration": (
        SideEvidence(configuration={"rope_theta": 1000000, "rms_norm_eps": 1e-6}),
        SideEvidence(configuration={"rope_theta": 500000, "rms_norm_eps": 1e-6}),
        Cause.CONFIGURATION,
        "rope_theta 500000 (rollout) vs 1000000 (training)",
    ),
    "sampling": (
        SideEvidence(sampling={"temperature": 1.0, "top_p": 1.0}),
        SideEvidence(sampling={"temperature": 0.8, "top_p": 1.0}),
        Cause.SAMPLING,
        "temperature 0.8 (rollout) vs 1.0 (training)",
    ),
    "token_ids": (
        SideEvidence(token_ids={"req-0": [1, 872, 3]}),
        SideEvidence(token_ids={"req-0": [1, 151644, 3]}),
        Cause.INPUTS,
        "token ids differ from position 1: 151644 (rollout) vs 872 (training) in request req-0",
    ),
}


@pytest.mark.parametrize("field", list(BOTH_SIDES))
def test_evidence_both_sides_recorded_and_differing_is_its_cause(field):
    training, rollout, cause, line = BOTH_SIDES[field]
    found = diagnose_facts(Facts([pair()], evidence=Evidence(training, rollout)))
    assert found.cause is cause and line in found.evidence
    assert not any(e.startswith(f"not recorded: {diagnosis.RECORDED[field]}") for e in found.evidence)
    assert (found.path is DiagnosisPath.AFTER_LOGITS) == (cause is Cause.SAMPLING)


def test_differing_token_ids_come_before_a_module_that_steps_up():
    """Inputs first: a module downstream of other token ids steps up because of them."""
    changed = RowFacts({("torch.float32", "torch.float32"): 10}, {}, {"embed_tokens input": 3e-3})
    found = diagnose_facts(Facts([stepped("embed_tokens output", row_facts=changed)]))
    assert found.cause is Cause.INPUTS
    assert found.evidence[0].startswith("embed_tokens input (integer ids: exact statistics, error 0 when equal)")


def test_a_module_in_another_dtype_on_one_side_where_the_error_steps_up_is_precision():
    head = RowFacts(
        {("torch.bfloat16", "torch.bfloat16"): 9, ("torch.bfloat16", "torch.float32"): 1},
        {"lm_head output": ("torch.bfloat16", "torch.float32")},
    )
    found = diagnose_facts(Facts([stepped(row_facts=head)]))
    assert (found.cause, found.path, found.module) == (Cause.PRECISION, DiagnosisPath.PREFILL, "lm_head")
    assert found.evidence[0].startswith("lm_head output float32 (rollout) vs bfloat16 (training)")
    same = RowFacts({("torch.bfloat16", "torch.bfloat16"): 10})
    assert diagnose_facts(Facts([stepped(row_facts=same)])).cause is Cause.MODULE


def test_a_step_after_routing_flips_within_the_noise_is_noise_not_a_module():
    bf16 = RowFacts({("torch.bfloat16", "torch.bfloat16"): 10})
    found = diagnose_facts(Facts([stepped("layers.1.mlp output", row_facts=bf16, routing_noise_layer=1)]))
    assert (found.cause, found.module) == (Cause.NOISE, None)
    assert any("went to other experts within the noise: noise, not a module" in e for e in found.evidence)


def test_an_fp32_gap_beyond_the_floor_that_nothing_compared_explains_is_unknown():
    sample = diagnosis.SampleCause("req-0", 1, gap={"tokens": 4, "mean": 0.1, "max": 0.3})
    found = diagnose_facts(Facts([pair()], samples=[sample]))
    assert found.cause is Cause.UNKNOWN
    assert found.sentence == "a log-prob gap of 0.3 beyond the floor 0.0001 that no compared module explains"
    assert any(e.startswith("not compared: the logits (msprobe skips lm_head under verl)") for e in found.evidence)


def test_the_rules_are_passed_in_and_unknown_is_what_none_of_them_explains():
    facts = Facts([pair()])
    assert diagnose_facts(facts).cause is Cause.NONE
    assert diagnose_facts(facts, rules=[r for r in DEFAULT_RULES if r is not diagnosis.nothing_differs]).cause is (
        Cause.UNKNOWN
    )
