"""Tensor parallel 2 on the real engines: a fault in a column-parallel module is named at that module.

verl's FSDP2 engine (whole tensors) against vLLM's CPU engine at TP 2 (two workers, ``VLLM_CPU_OMP_THREADS_BIND``)
and SGLang's at TP 2 (two schedulers, ``SGLANG_CPU_OMP_THREADS_BIND``), both on a copy of the model with layer 1's
``q_proj``, ``k_proj`` and ``v_proj`` weights x1.05: vLLM's and SGLang's fused ``qkv_proj``, whose output each
rank dumps a slice of. Before the shards were made whole this fault was named at the next replicated point
(``o_proj``'s output) and twelve tensors per pair were not comparable. The clean pairs and tensor mode are
checked on golden trees cut from the same engines (``tests/analysis/test_shards.py``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas
import pytest
from support import compare_runs, golden

from cpu_kit import verl_cpu
from msprobe_hooks.analysis.results import Status, Verdict

pytestmark = pytest.mark.engine  # runs a real engine (make test-fast leaves it out)

FACTOR = 1.05
PLANTED = "layers.1.self_attn.qkv_proj"
COMPARED_PER_PAIR = 19 * golden.LAYERS + 4  # as at TP 1


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    """The training dumps of the clean model, a copy with the planted fault, the prompts, the config."""
    from safetensors.torch import load_file, save_file

    work = tmp_path_factory.mktemp("tp-real")
    model = Path(verl_cpu.build_model_dir(str(work / "model"), layers=golden.LAYERS, hidden=128))  # 4 q, 2 KV heads
    perturbed = work / "perturbed"
    shutil.copytree(model, perturbed)
    weights = load_file(str(model / "model.safetensors"))
    for part in ("q_proj", "k_proj", "v_proj"):
        for kind in ("weight", "bias"):
            weights[f"model.layers.1.self_attn.{part}.{kind}"] *= FACTOR
    save_file(weights, str(perturbed / "model.safetensors"), metadata={"format": "pt"})
    prompts = work / "prompts.jsonl"
    prompts.write_text(
        "".join(f'{{"request_id": "{key}", "prompt_token_ids": {ids}}}\n' for key, ids in golden.PROMPTS.items())
    )
    config = compare_runs.msprobe_config(work / "statistics.json")
    train = compare_runs.run_training(work / "train", model, prompts, config)
    return train, perturbed, prompts, Path(config)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_qkv_fault_at_tp2_is_named_at_qkv_proj(tmp_path, inputs, engine):
    train, perturbed, prompts, config = inputs
    run = compare_runs.run_vllm if engine == "vllm" else compare_runs.run_sglang
    generate = run(tmp_path / engine, perturbed, prompts, str(config), tp=2)
    assert len(list(generate.glob("*/dispatch_log.jsonl"))) == 2  # a process per rank
    found = compare_runs.align(train, generate, tmp_path / "pairs.jsonl")
    assert sorted(p["key"] for p in found) == sorted(golden.PROMPTS)
    assert all([s["rank"] for s in p["generate"]["shards"]] == [0, 1] for p in found)
    _, results, modules = compare_runs.run_compare(tmp_path / "pairs.jsonl", tmp_path / "report")
    assert list(results.verdict) == [Verdict.DIVERGES.value] * 2
    assert set(results.first_module) == {PLANTED} and set(results.first_io) == {"output"}
    assert results.first_error.between(0.05 / 1.05 * 0.95, 0.05 / 1.05 * 1.05).all()
    assert list(results.compared) == [COMPARED_PER_PAIR] * 2
    not_comparable = modules[modules.status == Status.NOT_COMPARABLE.value]
    assert not not_comparable.reason.str.contains("tensor.parallel", na=False).any()
    before = modules[(modules.module == f"{PLANTED}") & (modules.io == "input")]
    assert (pandas.to_numeric(before.error) < 1e-5).all()  # the fault is in the module, not before it
