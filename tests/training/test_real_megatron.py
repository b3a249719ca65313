"""Training-side dumps on verl 0.9.1's real Megatron engine (megatron-core 0.16.1, mbridge 0.15.1, CPU, gloo, bf16).

``MegatronEngineWithLMHead`` as ``cpu_kit.megatron_cpu`` builds it, in a child process with the shim
active and nothing in the child that dumps (``tests/support/verl_engine_child.py``, backend
``megatron``): actor log-prob, ref log-prob, critic values, actor update, actor log-prob again (4
samples, micro-batches of 2), at tensor parallel 1 and 2 and pipeline parallel 2. Outputs are
compared with a run without DUMP_ON (``megatron_baseline``, shared with the fault suite) or with the
ref engine of the same run, which is never dumped; dumps and log lines are read from disk.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.verl_runs import (
    MEGATRON_SPEC,
    SAMPLES,
    EngineRun,
    assert_same_outputs,
    expected_sample,
    run_engine,
    sample_fields,
)

from cpu_kit import verl_cpu

pytestmark = pytest.mark.engine  # runs a real engine (make test-fast leaves it out)

PREFIX = "Module.0.module.module."  # DDP -> Float16Module -> GPTModel: the actor's chunk 0
EMBEDDING = PREFIX + "embedding.word_embeddings.VocabParallelEmbedding.forward.0"
FIRST_NORM = PREFIX + "decoder.layers.0.input_layernorm.RMSNorm.forward.0"
QKV = PREFIX + "decoder.layers.0.self_attention.linear_qkv.ColumnParallelLinear.forward.0"
HIDDEN = 64  # verl_cpu.build_model_dir's width; linear_qkv's output: 2 query, 1 key, 1 value head of 32 = 2 * HIDDEN
PADDED = 11  # verl pads every BSHD micro-batch to the mini-batch's longest sequence (7 + 4)
ACTOR_LOG_PROB, REF = 0, 1  # their places in verl_runs.OPS

CONFIGS = {  # name: (make_engine's parallel sizes, world size, environment, DUMP_ON)
    "log_prob": ({}, 1, {"DUMP_PHASE": "log_prob"}, True),
    "update_actor": ({}, 1, {"DUMP_PHASE": "update_actor"}, True),
    "prompts": ({}, 1, {"DUMP_PHASE": "all", "PROMPTS_ONLY": "1"}, True),
    "tp2_baseline": ({"tensor_parallel": 2}, 2, {}, False),
    "tp2": ({"tensor_parallel": 2}, 2, {"DUMP_PHASE": "all", "PROMPTS_ONLY": "1"}, True),
    # PROMPTS_ONLY=1 with pipeline parallelism is the trainer's trim: the log-prob batches come cut.
    "pp2": ({"pipeline_parallel": 2}, 2, {"DUMP_PHASE": "all", "PROMPTS_ONLY": "1"}, True),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, megatron_model_dir: str):
    """Child runs by name, each made once for the whole module when first asked for."""
    cache: dict[str, EngineRun] = {}
    root = tmp_path_factory.mktemp("megatron-runs")

    def get(name: str) -> EngineRun:
        if name not in cache:
            parallel, world_size, env, dump = CONFIGS[name]
            spec = {**MEGATRON_SPEC, "model_dir": megatron_model_dir, "parallel": parallel}
            spec.update(capture_logits=name == "prompts", trimmed=name == "pp2")
            run = run_engine(root / name, spec, world_size=world_size, dump=dump, **env)
            assert run.returncode == 0, run.stderr[-3000:]
            cache[name] = run
        return cache[name]

    return get


def _shape(entry: dict, index: int = 0) -> list[int]:
    return entry["input_args"][index]["shape"]


def _layer_inputs(dump: dict) -> list[list[int]]:
    """The ``[s, b]`` of every 3-D input of a decoder module in a dump (Megatron's decoder works in ``[s, b, h]``)."""
    return [
        arg["shape"][:2]
        for name, entry in dump.items()
        if name.startswith(PREFIX + "decoder.layers.") and ".forward." in name
        for arg in entry.get("input_args", [])
        if isinstance(arg, dict) and len(arg.get("shape") or []) == 3
    ]


def _has_backward(dump: dict) -> bool:
    return any(name.startswith(PREFIX) and ".backward." in name for name in dump)


def test_log_prob_phase_dumps_each_actor_micro_batch_and_changes_nothing(runs, megatron_baseline) -> None:
    run = runs("log_prob")
    lines = run.log_lines()
    # Two actor log-prob passes of two micro-batches; the ref, the critic and the update: nothing.
    assert [(line["phase"], line["micro_batch"], line["dump"]) for line in lines] == [
        ("log_prob", 0, "micro_batch"),
        ("log_prob", 1, "micro_batch"),
    ] * 2
    assert [line["step"] for line in lines] == run.steps() == [0, 1, 2, 3]
    first = lines[0]
    assert first["source"] == "update_actor" and first["rank"] == 0 and first["global_step"] == 1
    # BSHD: one padded row per sample, so no offset indexes the samples' tokens.
    assert sample_fields(first) == [expected_sample(0, offset=None), expected_sample(1, offset=None)]
    assert first["request_ids"] == [SAMPLES[0].request_id, SAMPLES[1].request_id] and first["num_requests"] == 2
    assert sample_fields(lines[1]) == [expected_sample(2, offset=None), expected_sample(3, offset=None)]
    assert {line["layer_offset"] for line in lines} == {0}  # one pipeline stage: its layers are the model's
    # Each dump holds its micro-batch, BSHD: both samples, padded to the mini-batch's longest.
    for step in run.steps():
        dump = run.dump(step)
        assert _shape(dump[EMBEDDING]) == [2, PADDED]
        assert _layer_inputs(dump) and all(sb == [PADDED, 2] for sb in _layer_inputs(dump))
        assert not _has_backward(dump)
    # Every output of every engine, the update and the pass after it included, is bit-identical.
    assert_same_outputs(run, megatron_baseline, range(len(MEGATRON_SPEC["ops"])))


def test_update_phase_dumps_each_micro_batch_with_its_backward_and_changes_nothing(runs, megatron_baseline) -> None:
    run = runs("update_actor")
    lines = run.log_lines()
    assert [(line["step"], line["phase"], line["micro_batch"], line["dump"]) for line in lines] == [
        (0, "update_actor", 0, "micro_batch"),
        (1, "update_actor", 1, "micro_batch"),
    ]
    assert run.steps() == [0, 1]
    assert sample_fields(lines[0]) == [expected_sample(0, offset=None), expected_sample(1, offset=None)]
    assert sample_fields(lines[1]) == [expected_sample(2, offset=None), expected_sample(3, offset=None)]
    for step in (0, 1):
        names = list(run.dump(step))
        assert EMBEDDING in names and _has_backward(run.dump(step)), f"step {step} lacks its forward or backward"
        # The backward follows the forward in the same dump: the window closed after the backward.
        backward = next(i for i, name in enumerate(names) if ".backward." in name)
        assert names.index(EMBEDDING) < backward
    # Measured: msprobe's module backward hooks (level mix) leave Megatron's update bit-identical here
    # (drift 0.0 in loss, grad norm and the next log-probs; FSDP2's shifts by ~1e-6), so no tolerance.
    assert_same_outputs(run, megatron_baseline, range(len(MEGATRON_SPEC["ops"])))


def test_prompts_only_dumps_each_prompt_alone_as_its_prefill(runs, megatron_baseline) -> None:
    run = runs("prompts")
    lines = run.log_lines()
    assert [line["step"] for line in lines] == run.steps() == list(range(10))
    # One dump per sample in each log-prob pass, in micro-batch order; the update's micro-batches whole.
    assert [(line["phase"], line["micro_batch"], line["dump"]) for line in lines] == [
        *[("log_prob", 0, "prompt")] * 2,
        *[("log_prob", 1, "prompt")] * 2,
        ("update_actor", 0, "micro_batch"),
        ("update_actor", 1, "micro_batch"),
        *[("log_prob", 0, "prompt")] * 2,
        *[("log_prob", 1, "prompt")] * 2,
    ]
    prompt_lines = [line for line in lines if line["dump"] == "prompt"]
    for n, line in enumerate(prompt_lines):
        index = n % 4
        assert sample_fields(line) == [expected_sample(index)]
        assert line["request_ids"] == [SAMPLES[index].request_id] and line["num_requests"] == 1
        # The dump is the prompt's prefill: the token ids alone, and every decoder layer at [p, 1, h].
        dump, prompt_len = run.dump(line["step"]), len(SAMPLES[index].prompt)
        assert _shape(dump[EMBEDDING]) == [1, prompt_len]
        assert _layer_inputs(dump) and all(sb == [prompt_len, 1] for sb in _layer_inputs(dump))
        assert not _has_backward(dump)
    assert all(_has_backward(run.dump(line["step"])) for line in lines if line["phase"] == "update_actor")
    # Per micro-batch: each prompt alone, then the real forward of the padded micro-batch.
    results = run.results()
    assert results[ACTOR_LOG_PROB]["forward_tokens"] == [5, 7, PADDED, 4, 6, PADDED]
    assert results[REF]["forward_tokens"] == [PADDED, PADDED]  # the ref engine: no extra forward
    # The prompt-only logits are the prefix of the real forward's rows ([b, s, v] in BSHD). Measured: equal
    # to the bit here; the bound leaves one bf16 rounding step, far below what another prompt would give.
    logits = run.reports[0]["logits"]
    prompt_rows = [logits[0][0], logits[1][0], logits[3][0], logits[4][0]]
    full_rows = [logits[2][0], logits[2][1], logits[5][0], logits[5][1]]
    for i, (prompt_row, full_row) in enumerate(zip(prompt_rows, full_rows, strict=True)):
        assert len(prompt_row) == len(SAMPLES[i].prompt)
        diff = max(abs(a - b) for p, f in zip(prompt_row, full_row, strict=False) for a, b in zip(p, f, strict=True))
        assert diff <= 1e-2, f"sample {i}: prompt-only logits differ from the prefill's by {diff}"
    # Outputs as without DUMP_ON: log-probs, values, the update (with its dumped backward) and the pass after it.
    assert_same_outputs(run, megatron_baseline, range(len(MEGATRON_SPEC["ops"])))


def test_tensor_parallel_2_dumps_on_both_ranks_and_changes_nothing(runs) -> None:
    run, baseline = runs("tp2"), runs("tp2_baseline")
    for rank in (0, 1):
        lines = run.log_lines(rank)
        assert [line["step"] for line in lines] == run.steps(rank) == list(range(10))
        assert {line["rank"] for line in lines} == {rank}
        prompts = [line for line in lines if line["dump"] == "prompt"]
        assert [sample_fields(line) for line in prompts] == [[expected_sample(i % 4)] for i in range(8)]
        for n, line in enumerate(prompts):
            dump = run.dump(line["step"], rank)
            # verl pads a BSHD sequence to a multiple of the TP size: a 5-token prompt is dumped as 6 tokens.
            tokens = -(-len(SAMPLES[n % 4].prompt) // 2) * 2
            assert _shape(dump[EMBEDDING]) == [1, tokens]
            # Each rank dumps its own shard: half of linear_qkv's 2 * HIDDEN outputs.
            assert dump[QKV]["output"][0]["shape"] == [tokens, 1, HIDDEN]
        # Both TP ranks ran the same forwards (each holds the micro-batch): prompts, then the padded real one.
        assert run.results(rank)[ACTOR_LOG_PROB]["forward_tokens"] == [6, 8, 12, 4, 6, 12]
        assert_same_outputs(run, baseline, range(len(MEGATRON_SPEC["ops"])), rank=rank)


def test_pipeline_parallel_2_dumps_on_the_last_stage_only(runs) -> None:
    run = runs("pp2")
    # The first stage (embedding, layer 0) dumps nothing and writes no log.
    assert run.steps(0) == [] and run.log_lines(0) == []
    assert not list(run.dump_root.glob("step*/rank0"))
    lines = run.log_lines(1)
    assert [line["step"] for line in lines] == run.steps(1) == list(range(6))
    # The last stage names its one layer layers.0: the line says it is the model's layer 1.
    assert {line["layer_offset"] for line in lines} == {1}
    # No extra forward fits the pipeline schedule: the trimmed batches' real forwards are the prefills.
    assert [(line["phase"], line["micro_batch"], line["dump"]) for line in lines] == [
        ("log_prob", 0, "micro_batch"),
        ("log_prob", 1, "micro_batch"),
        ("update_actor", 0, "micro_batch"),
        ("update_actor", 1, "micro_batch"),
        ("log_prob", 0, "micro_batch"),
        ("log_prob", 1, "micro_batch"),
    ]
    prompt_lens = [len(s.prompt) for s in SAMPLES]
    for line in lines:
        dump = run.dump(line["step"], 1)
        assert EMBEDDING not in dump  # the last stage holds the last layer, as its own layers.0
        trimmed = line["phase"] == "log_prob"
        want = [expected_sample(i, offset=None) for i in ((0, 1) if line["micro_batch"] == 0 else (2, 3))]
        if trimmed:  # the trim leaves each sample its prompt alone: no response in the batch
            want = [{**sample, "seq_len": sample["prompt_len"], "response_len": 0} for sample in want]
        assert sample_fields(line) == want
        assert _shape(dump[FIRST_NORM]) == [max(prompt_lens) if trimmed else PADDED, 2, HIDDEN]
        assert _has_backward(dump) == (not trimmed)
    # The never-dumped ref engine gets the actor's log-probs to the bit, on the stage that has them.
    results = run.results(1)
    assert results[ACTOR_LOG_PROB]["log_probs"] == results[REF]["log_probs"] != []
    assert run.results(0)[ACTOR_LOG_PROB]["log_probs"] == []


def test_virtual_pipeline_parallelism_is_refused(tmp_path: Path) -> None:
    # Two chunks of two layers on each of two stages: a model of four layers. The last stage refuses its
    # first due pass, before any work; torchrun then stops the other rank. (The other refusals of the patch
    # are driven through the stand-in, test_verl_megatron_standin.py.)
    model_dir = verl_cpu.build_model_dir(str(tmp_path / "model"), layers=4)
    parallel = {"pipeline_parallel": 2, "virtual_pipeline": 2}
    spec = {**MEGATRON_SPEC, "ops": ["actor.log_prob"], "model_dir": model_dir, "parallel": parallel}
    run = run_engine(tmp_path / "run", spec, world_size=2, DUMP_PHASE="all")
    assert run.returncode != 0 and run.reports == []
    assert not list(run.dump_root.glob("step*")) and run.log_lines() == []
    refusals = [line for line in run.stderr.splitlines() if "DumpRefused: DUMP_ON=1 with virtual pipeline" in line]
    assert len(refusals) == 1 and "(2 model chunks per rank)" in refusals[0], run.stderr[-3000:]
