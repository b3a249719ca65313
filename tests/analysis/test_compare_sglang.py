"""``msprobe-hooks align`` + ``compare`` on real pairs: verl's FSDP2 engine against SGLang 0.5.21 on CPU.

One training run (``tests/support/compare_runs.py``: level L0 statistics, one prompt-only dump per prompt)
and two SGLang runs on the same prompts, one prompt per ``generate`` call, dumped by SGLang's own
switch (``msprobe_dump_config``) under ``DUMP_ON=1``: on the same weights, and on the copy with
``layers.1.mlp.down_proj`` x1.05. The vLLM counterpart is ``tests/analysis/test_compare.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.compare_runs import align, msprobe_config, run_compare, run_sglang, run_training

from cpu_kit.demo_inputs import LAYERS, PERTURBATION, PERTURBED_MODULE, PROMPT_LENS, build_models, write_prompts
from msprobe_hooks.analysis.comparing import names
from msprobe_hooks.analysis.results import Status, Verdict

pytestmark = pytest.mark.engine  # runs a real engine (make test-fast leaves it out)

# As against vLLM: per decoder layer 19 tensors, plus the embedding and the final norm.
COMPARED_PER_PAIR = 19 * LAYERS + 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare-sglang")
    model, perturbed = build_models(root)
    prompts = write_prompts(root / "prompts.jsonl")
    config = msprobe_config(root / "statistics-L0.json")
    return root, model, perturbed, prompts, config, run_training(root / "train", model, prompts, config)


def _pairs(setup, name: str, model: Path) -> tuple[Path, list[dict]]:
    root, _, _, prompts, config, train_root = setup
    generate_root = run_sglang(root / name, model, prompts, config)
    pairs_file = root / name / "pairs.jsonl"
    return pairs_file, align(train_root, generate_root, pairs_file)


@pytest.fixture(scope="module")
def l0(setup):
    return _pairs(setup, "same", setup[1])


@pytest.fixture(scope="module")
def l0_perturbed(setup):
    return _pairs(setup, "perturbed", setup[2])


def test_align_pairs_every_prompt_by_request_id(l0):
    pairs_file, pairs = l0
    # one pair per prompt, by the rid SGLang kept as sent, each its request's own EXTEND
    assert sorted(p["key"] for p in pairs) == [f"req-{i}" for i in range(len(PROMPT_LENS))]
    assert {p["rule"] for p in pairs} == {"request_id"}
    ordered = sorted(pairs, key=lambda p: p["key"])
    assert [p["prompt_len"] for p in ordered] == list(PROMPT_LENS)
    assert [p["generate"]["tokens"] for p in ordered] == list(PROMPT_LENS)
    assert {(p["generate"]["engine"], p["generate"]["num_requests"], p["generate"]["filtered"]) for p in pairs} == {
        ("sglang", 1, False)
    }
    # SGLang's switch dumps every forward, decodes too: each pair is its request's EXTEND, whole
    (log,) = {p["generate"]["log"] for p in pairs}
    lines = [json.loads(line) for line in (pairs_file.parent / log).read_text().splitlines()]
    assert len(lines) > len(pairs) and {line["phase"] for line in lines} == {"prefill", "decode"}
    for pair in pairs:
        line = lines[pair["generate"]["line"] - 1]
        assert (line["step"], line["forward_mode"]) == (pair["generate"]["step"], "EXTEND")
        assert [(r["request_id"], r["full_prefill"]) for r in line["requests"]] == [(pair["key"], True)]
        dump = pairs_file.parent / pair["generate"]["dump"]
        embedding = json.loads(dump.read_text())["data"]["Module.model.embed_tokens.VocabParallelEmbedding.forward.0"]
        assert embedding["input_args"][0]["shape"] == [pair["prompt_len"]]


def test_identical_weights_no_divergence(l0, tmp_path):
    done, results, rows = run_compare(l0[0], tmp_path / "report")
    assert list(results["verdict"]) == [Verdict.NO_DIVERGENCE] * 4
    assert list(results["compared"]) == [COMPARED_PER_PAIR] * 4
    assert list(results["unmatched"]) == [0] * 4
    assert results["max_error"].max() < 1e-5  # measured <= 5.8e-7 in fp32
    cause, first = done.stdout.splitlines()[:2]
    assert cause.startswith("cause: none: ") and first.startswith(f"4 pairs: {Verdict.NO_DIVERGENCE}")
    # SGLang's fused-residual norm: output 1 is the previous layer's output, as vLLM's
    stream = rows[(rows["pair"] == 0) & (rows["module"] == "layers.0") & (rows["io"] == "output")].iloc[0]
    assert stream["generate_name"].endswith("layers.1.input_layernorm.RMSNorm.forward.0.output.1")
    # SGLang dumps the whole decoder stack, which msprobe skips on the training side under verl
    stack = rows[rows["generate_name"].fillna("").str.startswith("Module.model.Qwen2Model.forward.0.")]
    assert len(stack) == 4 * 3  # input ids, positions, output; per pair
    assert set(stack["status"]) == {Status.NOT_COMPARABLE}
    assert set(stack["reason"]) == {names.load().reasons["whole_model"]}


def test_perturbed_weights_name_the_module(l0_perturbed, tmp_path):
    done, results, rows = run_compare(l0_perturbed[0], tmp_path / "report")
    assert list(results["verdict"]) == [Verdict.DIVERGES] * 4
    assert list(results["first_module"]) == [PERTURBED_MODULE] * 4
    assert list(results["first_io"]) == ["output"] * 4
    expected = (PERTURBATION - 1) / PERTURBATION  # |train - gen| / |gen| with gen = 1.05 train
    assert results["first_error"].sub(expected).abs().max() < 1e-3
    assert f"first divergence: {PERTURBED_MODULE} output" in done.stdout
    inputs = rows[(rows["module"] == PERTURBED_MODULE) & (rows["io"] == "input")]
    assert inputs["error"].max() < 1e-5  # its input still agrees: the change is inside that module
