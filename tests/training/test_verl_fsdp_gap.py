"""The log-prob gap log, whole-sequence dumps and dumps chosen by request id, on verl 0.9.1's real FSDP2 engine.

Each configuration runs ``tests/support/verl_engine_child.py`` once in a fresh interpreter with the
shim active: 4 samples (prompts of 5, 7, 4, 6 tokens, responses of 3, 4, 3, 4) in micro-batches of 2,
so every micro-batch packs two samples; samples 0 and 1 share a uid (``rollout.n = 2`` of one prompt),
as do 2 and 3. The batches carry the rollout's log-probs (``rollout.calculate_log_probs=True``) and a
temperature other than 1, which verl divides the logits by. What the gap lines (and ``engine.jsonl``)
must say is computed here from what the engine returned and what the batch held.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.logprob_gaps import GAP_FIELDS, assert_gap, expected_gap
from support.verl_runs import EngineRun, run_engine, write_config

from cpu_kit import verl_cpu
from msprobe_hooks import join_keys, numerics

pytestmark = pytest.mark.engine  # runs a real engine (make test-fast leaves it out)

TEMPERATURE = 0.8
SPEC = {
    "ops": ["actor.log_prob"],
    "count": 4,
    "seed": 0,
    "micro_batch_size": 2,
    "rollout_log_probs": True,
    "temperature": TEMPERATURE,
}
SAMPLES = verl_cpu.random_samples(4, 0)
EMBEDDING = "Module.model.embed_tokens.FSDPEmbedding.forward.0"
THRESHOLD = 0.1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return verl_cpu.build_model_dir(str(tmp_path_factory.mktemp("model")))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory, model_dir: str) -> EngineRun:
    """The log-prob pass without DUMP_ON: the log-probs every run must reproduce bit for bit."""
    run = run_engine(tmp_path_factory.mktemp("baseline"), {**SPEC, "model_dir": model_dir}, dump=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def _run(tmp_path: Path, model_dir: str, spec: dict | None = None, **env: str) -> EngineRun:
    run = run_engine(tmp_path, {**SPEC, "model_dir": model_dir, **(spec or {})}, **env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "the host goes on unaffected" not in run.stderr, run.stderr[-3000:]
    return run


def _gap_lines(run: EngineRun) -> list[dict]:
    lines = []
    for path in sorted(run.dump_root.glob(f"*/{join_keys.GAP_LOG}")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


def _expected_lines(run: EngineRun, rank: int = 0, micro_batch_size: int = 2, threshold: float = THRESHOLD):
    """Per pass, per sample, what the line must say: from the pass's log-probs and the batch as fed."""
    fed = run.reports[rank]["fed"]
    expected = []
    for result in run.results(rank):
        if result["op"] != "actor.log_prob":
            continue
        for i, (row, given) in enumerate(zip(result["log_probs"], fed, strict=True)):
            rollout, mask = given["rollout_log_probs"], given["response_mask"]
            response_len = len(mask)  # v1: one entry per response token
            prompt_len = len(row) - response_len
            old = row[prompt_len - 1 : prompt_len - 1 + response_len]
            gap = expected_gap(old, rollout, mask, threshold)
            expected.append({"micro_batch": i // micro_batch_size, "sample": i % micro_batch_size, **gap})
    return expected


def _assert_same_log_probs(run: EngineRun, baseline: EngineRun) -> None:
    assert run.results()[0]["log_probs"] == baseline.results()[0]["log_probs"]


def test_a_gap_line_per_sample_in_every_log_prob_pass_equal_to_verls_definitions(tmp_path, model_dir, baseline):
    # Two log-prob passes; DUMP_PHASE=update_actor: neither is dumped, no debugger is made, and yet
    # every sample of both gets its line. Samples 0 and 1 share a request id too (under
    # rollout.full_determinism verl names requests "det-{priority}", and the v1 trainer gives every
    # sample priority 0); sample 1's third response token is a tool token (response_mask 0).
    spec = {"ops": ["actor.log_prob", "actor.log_prob"], "request_ids": ["det-0", "det-0", "req-b", "req-c"]}
    spec.update(masked=[[1, 2]], capture_logits=True)
    run = _run(tmp_path, model_dir, spec, DUMP_PHASE="update_actor")
    _assert_same_log_probs(run, baseline)
    assert run.results()[1]["log_probs"] == baseline.results()[0]["log_probs"]
    assert not list(run.dump_root.glob(f"*/{join_keys.TRAINING_LOG}")) and not list(run.dump_root.glob("step*"))
    lines = _gap_lines(run)
    assert [list(line) for line in lines] == [GAP_FIELDS] * 8
    expected = _expected_lines(run)
    assert len(lines) == len(expected) == 8
    for line, want in zip(lines, expected, strict=True):
        assert (line["micro_batch"], line["sample"]) == (want["micro_batch"], want["sample"])
        assert_gap(line, want)
    index = [2 * line["micro_batch"] + line["sample"] for line in lines]
    assert index == [0, 1, 2, 3] * 2
    for line, i in zip(lines, index, strict=True):
        sample = SAMPLES[i]
        assert line["source"] == "logprob_gap" and line["rank"] == 0 and line["global_step"] == 1
        assert line["request_id"] == spec["request_ids"][i] and line["threshold"] == THRESHOLD
        assert (line["uid"], line["session_id"]) == (sample.uid, sample.session_id)
        assert line["prompt_len"] == len(sample.prompt)
        assert line["prompt_hash"] == join_keys.prompt_hash(sample.prompt)
    # The masked token is not counted; the threshold splits the tokens (else `over` proves nothing).
    assert [line["tokens"] for line in lines[:4]] == [3, 3, 3, 4]
    assert 0 < sum(line["over"] for line in lines[:4]) < sum(line["tokens"] for line in lines[:4])
    # The pass is not dumped: no line carries its tokens (MSPROBE_HOOKS_GAP_TOKENS=dumped).
    assert not any("token_ids" in line for line in lines)
    _assert_the_temperature_and_the_engine_line(run, lines, model_dir)


def _assert_the_temperature_and_the_engine_line(run: EngineRun, lines: list[dict], model_dir: str) -> None:
    """The gap lines' temperature is the one verl's forward divided the logits by, and engine.jsonl says what
    its forward computed in: both checked against the root module's own logits, captured in the child."""
    result = run.results()[0]
    packed = [SAMPLES[0].prompt + SAMPLES[0].response + SAMPLES[1].prompt + SAMPLES[1].response]
    packed.append(SAMPLES[2].prompt + SAMPLES[2].response + SAMPLES[3].prompt + SAMPLES[3].response)
    returned = [value for row in result["log_probs"] for value in row]
    recomputed, unscaled = [], []
    for logits, ids in zip(run.reports[0]["logits"][:2], packed, strict=True):  # the first pass's two micro-batches
        logits = torch.tensor(logits)
        labels = torch.tensor(ids[1:] + ids[:1])  # verl rolls the packed ids by one
        for temperature, out in ((TEMPERATURE, recomputed), (1.0, unscaled)):
            out += torch.log_softmax(logits / temperature, -1).gather(-1, labels[:, None])[:, 0].tolist()
    assert returned == pytest.approx(recomputed, abs=1e-5) and returned != pytest.approx(unscaled, abs=1e-3)
    assert {line["temperature"] for line in lines} == {TEMPERATURE}
    [path] = run.dump_root.glob(f"*/{join_keys.ENGINE_LOG}")
    [engine] = [json.loads(line) for line in path.read_text().splitlines()]
    assert (engine["side"], engine["engine"], engine["rank"]) == ("train", "verl-fsdp", 0)
    settings = engine["numerics"]
    # The CPU kit's engine asks verl for fp32 (mixed_precision fp32): its forward's logits are float32.
    assert settings["model_dtype"] == settings["logits_dtype"] == result["logits_dtype"] == "float32"
    assert settings["param_dtype"] == "float32" and settings["log_probs_dtype"] == "float32"
    assert (settings["attention_implementation"], settings["remove_padding"]) == ("eager", True)
    from transformers import AutoConfig

    # The folder's configuration, as another engine would load it: verl's own overrides (the tokenizer's token
    # ids, the attention implementation) leave the fingerprint alone.
    config = AutoConfig.from_pretrained(model_dir)
    assert engine["model_config_fingerprint"] == numerics.config_fingerprint(config.to_dict())
    assert engine["model_config"]["num_hidden_layers"] == config.num_hidden_layers
    assert engine["model_config"]["rotary"]["base"] == config.rope_parameters["rope_theta"]


def test_the_v0_trainer_layout_gives_the_same_gaps_and_the_log_the_offsets(tmp_path, model_dir, baseline):
    # v0 (DataProto, left_right_2_no_padding): dense, right-padded rollout log-probs and response mask.
    # DUMP_PHASE=log_prob: both micro-batches are dumped, and their log lines give each sample's offset.
    run = _run(tmp_path, model_dir, {"layout": "v0"}, DUMP_PHASE="log_prob", MSPROBE_HOOKS_GAP_THRESHOLD="0.2")
    _assert_same_log_probs(run, baseline)
    fed = run.reports[0]["fed"]
    assert len(fed[0]["rollout_log_probs"]) == 4  # padded to the batch's response width
    lines = _gap_lines(run)
    assert len(lines) == 4
    for i, line in enumerate(lines):
        row, sample = run.results()[0]["log_probs"][i], SAMPLES[i]
        p, r = len(sample.prompt), len(sample.response)
        want = expected_gap(row[p - 1 : p - 1 + r], fed[i]["rollout_log_probs"][:r], fed[i]["response_mask"][:r], 0.2)
        assert_gap(line, want)
        assert line["threshold"] == 0.2 and line["session_id"] is None  # v0 batches carry no session id
    logged = run.log_lines()
    assert [[(s["offset"], s["response_len"]) for s in line["samples"]] for line in logged] == [
        [(0, 3), (8, 4)],
        [(0, 3), (7, 4)],
    ]


def test_whole_sequences_and_prompts_of_the_chosen_requests_only(tmp_path, model_dir, baseline):
    # PROMPTS_ONLY=1 and DUMP_SEQUENCES=1, in msprobe's tensor mode; DUMP_REQUEST_IDS names sample 1
    # (as the inference side's log writes it: with vLLM's suffix) and sample 2.
    config = write_config(tmp_path / "tensor.json", task="tensor", level="L0")
    chosen = f"{SAMPLES[1].request_id}-0a1b2c3d,{SAMPLES[2].request_id}"
    env = {"DUMP_PHASE": "log_prob", "PROMPTS_ONLY": "1", "DUMP_SEQUENCES": "1", "DUMP_REQUEST_IDS": chosen}
    run = _run(tmp_path, model_dir, MSPROBE_ACTOR_CONFIG=config, **env)
    _assert_same_log_probs(run, baseline)
    lines = run.log_lines()
    # Per chosen sample two windows, prompt first; the other samples' forwards ran undumped.
    assert [(line["step"], line["micro_batch"], line["dump"]) for line in lines] == [
        (0, 0, "prompt"),
        (1, 0, "sequence"),
        (2, 1, "prompt"),
        (3, 1, "sequence"),
    ]
    assert run.steps() == [0, 1, 2, 3]
    for line, index in zip(lines, [1, 1, 2, 2], strict=True):
        sample = SAMPLES[index]
        assert [s["request_id"] for s in line["samples"]] == [sample.request_id] == line["request_ids"]
        record = line["samples"][0]
        assert (record["offset"], record["response_len"]) == (0, len(sample.response))
        tokens = sample.prompt + (sample.response if line["dump"] == "sequence" else ())
        assert run.dump(line["step"])[EMBEDDING]["input_args"][0]["shape"] == [1, len(tokens)]
        ids = torch.load(
            run.dump_root / f"step{line['step']}" / "rank0" / "dump_tensor_data" / f"{EMBEDDING}.input.0.pt"
        )
        assert ids.tolist() == [list(tokens)]
    # Every forward, in order: in each micro-batch both samples' prompt and sequence, then the real one.
    lengths = [(len(s.prompt), len(s.prompt) + len(s.response)) for s in SAMPLES]
    assert run.results()[0]["forward_tokens"] == [
        *lengths[0],
        *lengths[1],
        lengths[0][1] + lengths[1][1],
        *lengths[2],
        *lengths[3],
        lengths[2][1] + lengths[3][1],
    ]
    # The gap log is not filtered.
    assert [(line["micro_batch"], line["sample"]) for line in _gap_lines(run)] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_a_packed_micro_batch_dump_gives_each_samples_offset_in_its_input_ids(tmp_path, model_dir, baseline):
    # Plain micro-batch dumps in tensor mode; DUMP_REQUEST_IDS names sample 3: only the second
    # micro-batch, which holds it, is dumped (both of its samples, packed into one row).
    config = write_config(tmp_path / "tensor.json", task="tensor", level="L0")
    run = _run(tmp_path, model_dir, DUMP_PHASE="log_prob", MSPROBE_ACTOR_CONFIG=config, DUMP_REQUEST_IDS="req-uid-3")
    _assert_same_log_probs(run, baseline)
    lines = run.log_lines()
    assert [(line["step"], line["micro_batch"], line["dump"]) for line in lines] == [(0, 1, "micro_batch")]
    ids = torch.load(run.dump_root / "step0" / "rank0" / "dump_tensor_data" / f"{EMBEDDING}.input.0.pt")[0].tolist()
    records = lines[0]["samples"]
    assert [r["offset"] for r in records] == [0, 7] and len(ids) == 7 + 10
    for record, sample in zip(records, SAMPLES[2:], strict=True):
        start = record["offset"]
        assert ids[start : start + record["seq_len"]] == list(sample.prompt + sample.response)
        assert ids[start + record["prompt_len"] : start + record["seq_len"]] == list(sample.response)
        assert record["response_len"] == len(sample.response)


def test_naming_no_real_request_logs_the_gap_alone(tmp_path, model_dir, baseline):
    # docs/training.md's way to log the gap without dumping anything: every pass is due, none is dumped.
    spec = {"ops": ["actor.log_prob", "actor.update"]}
    run = _run(tmp_path, model_dir, spec, DUMP_PHASE="all", DUMP_REQUEST_IDS="none")
    _assert_same_log_probs(run, baseline)
    assert run.steps() == [] and run.log_lines() == []
    assert len(_gap_lines(run)) == 4  # the log-prob pass only
