"""Cut the golden dump trees of ``tests/golden/`` from real engine runs (run once; the result is checked in).

    .venv/bin/python scripts/make_golden.py [OUT] [--only SET]   (default tests/golden; needs .venv-vllm, .venv-sglang)

The fast tier (``make test-fast``) tests names, align, compare and the report on these trees
without starting an engine. Each naming gets a folder holding the trees ``align`` reads: the
training side as ``actor/`` (``{pid}/update_actor_log.jsonl`` and ``step{N}/rank{R}/dump.json``), the
inference side as ``generate/`` (``{pid}/dispatch_log.jsonl`` and its dumps). They come from the
tests' own helpers (``tests/support/compare_runs.py``) on a tiny random Qwen2 (2 layers, hidden 64,
head_dim 32) and two prompts, msprobe statistics at level L0, plus one tensor-mode pair:

* ``fsdp2/`` verl's real FSDP2 engine (``PROMPTS_ONLY=1`` prompt-only dumps), ``vllm/`` vLLM's CPU
  engine, ``sglang/`` SGLang's CPU engine, ``tensor/`` the FSDP2 and vLLM trees in tensor mode;
* ``fsdp1/`` the FSDP2 tree with its module names as FSDP1 writes them (``_fsdp_wrapped_module.``
  at the root and in each decoder layer): FSDP1 does not run on a CPU, the rewrite is the only
  change, and it is said so here and in the tree's README;
* a weights copy with ``layers.1.mlp.down_proj`` x1.05 for vLLM (``vllm_perturbed/``);
* ``verdict/``: fp32 training (``actor/``) against vLLM in fp32 and bf16 on the demo's 4-layer model
  (hidden 128, 4 prompts), clean and with one weight scaled (``VERDICT_CASES``): the proof of the verdict
  rules on real pairs.
* ``decode/``: decode pairs (docs/analysis.md, "Decode pairs"), all in tensor mode at L0 on the namings'
  model, in RL's order: the rollout first, then training on each prompt and the response it generated
  (``rollout.jsonl``, with the rollout's log-probs: the training side logs the gap too).
  ``vllm/``: vLLM's CPU engine, its engine core in-process so that the waves fix the packing
  (``DECODE_PACKED``): a prefill alone, then a decode row beside two prefills, decode rows beside each
  other, moving when one finishes; then, on the same engine, ``support.real_vllm.PREEMPTION_REQUESTS`` in
  a KV cache of three 32-token blocks: pre-c is preempted and recomputed (one prefill row of its prompt
  and the 3 tokens it had generated, beside pre-b's decode row at offset 8); msprobe's step filter leaves
  out the steps the set does not need. ``sglang/``: SGLang's CPU engine on the packed prompts in one
  wave, prefills chunked by 8 tokens and mixed with decode rows (``DECODE_SGLANG``), the same tokens as
  vLLM; it decodes once past each request's last token. ``actor/``: verl's FSDP2 engine with
  ``PROMPTS_ONLY=1 DUMP_SEQUENCES=1``, a prompt dump and a whole-sequence dump per sample but pre-a and
  pre-b (``DUMP_REQUEST_IDS``, ``DECODE_UNDUMPED``), and its ``logprob_gap.jsonl``;
  ``actor_micro_batch/``: the same run with ``PROMPTS_ONLY=0``, its first micro-batch alone (req-0 and
  req-1 packed back to back, ``offset`` 0 and 10). Tensor files are written as ``.npy`` (the same values;
  a ``.pt`` zip's ~2.4 KB container is most of such a file): 3.7 MB instead of 9.4.

* ``megatron/``: verl's real Megatron engine (bf16, the local layer spec; ``make install-megatron``) at
  TP 1 (``tp1/``) and TP 2 (``tp2/``, a rank folder each) on the demo's model and prompts, against vLLM
  in fp32 (``vllm/``), in bf16 (``vllm_bf16/``), on the demo's perturbed copy (``vllm_perturbed/``) and at
  TP 2 (``vllm_tp2/``, one ``{pid}`` folder per rank);
* ``tp2/``: tensor parallel 2 on a 2-layer model of 4 query and 2 KV heads (hidden 128, ``TP2_MODEL``):
  ``actor/`` verl's FSDP2 engine, ``vllm/`` and ``sglang/`` the engines at TP 2 (one ``{pid}`` folder per
  rank), ``vllm_gate_up/`` vLLM at TP 2 on a copy with layer 1's ``gate_proj`` and ``up_proj`` x1.04 (a
  column-parallel module), ``tensor_actor/`` and ``tensor_vllm/`` in tensor mode (vLLM: the prefill steps
  alone);
* ``replicas/``: the same model, four prompts, FSDP2 at world size 2 (``actor/``: ranks 0 and 1) against two
  vLLM replicas dumping into one ``generate/`` folder, as the replicas of one job do: replica A at TP 1 served
  ``req-0`` and ``req-2``, replica B at TP 2 ``req-1`` and ``req-3`` (run one after the other: the machine has two
  cores, and TP 2 binds both).

* ``qwen3/``: a tiny Qwen3 (q/k norms; 2 layers, hidden 128): FSDP2 (``actor/``) against vLLM and SGLang,
  and vLLM on a copy with ``layers.1.self_attn.k_norm`` x1.05 (``vllm_k_norm/``);
* ``moe/``: a tiny Qwen3-MoE (3 layers of 8 experts, top 2; ``cpu_kit/moe_inputs.py``): FSDP2 in tensor mode
  (``actor/``: of its tensors, the routers' logits and expert ids) and in statistics (``actor_statistics/``), vLLM with
  ``MSPROBE_HOOKS_ROUTING=1`` (its ``routed_experts.jsonl``) in fp32 (``fp32/``) and bf16 (``bf16/``), on a
  copy whose layer-1 router sends a known share of the tokens elsewhere (``router/``, ``bf16_router/``; what
  was planted: ``router_fault.json``), on one with ``layers.1.self_attn.o_proj`` x1.05 (``attention/``), and
  without the routing switch (``no_routing/``: the routing of its dumped steps recorded all the same). Each
  training process's ``routed_experts.jsonl`` is beside its log, in statistics and tensor mode alike.
* ``moe_sglang/``: the same Qwen3-MoE on SGLang in tensor mode (its ``TopK`` module's expert ids), against
  ``moe/actor``; cut to its prefill steps and, of its tensors, the expert ids;
* ``shared_experts/``: a tiny Qwen2-MoE (a gated shared expert beside the routed ones): FSDP2 against vLLM,
  statistics.

* ``main_ppo/``: verl's own trainer (``python -m cpu_kit.main_ppo``, the v1 trainer, two global steps,
  docs/verl-main-ppo.md) with a real setting of verl's own configuration each (``MAIN_PPO_CASES``): FSDP's mixed
  precision left at verl's default, a bf16 forward under ``model_dtype=fp32``, against vLLM in fp32
  (``bf16_forward/``); bf16 on both sides, no fault (``bf16/``); the same with the rollout at temperature 0.8 and
  ``logprobs_mode=raw_logprobs`` (``bf16_raw_logprobs/``); fp32 with the rollout's ``top_p`` 0.7 (``top_p/``).
  Each cut to what its pairs read: the two samples' prompt dumps, the two prefills they pair with (the dispatch
  log's lines of those steps alone), the logs and both sides' ``engine.jsonl`` and ``requests.jsonl``.

* ``sglang_loop/``: the CPU kit's RL loop (one global step) with SGLang rolling out on the demo's model and prompts,
  sampled at temperature 0.8 with verl's FSDP2 engine recomputing at 0.8 (``SGLANG_LOOP_CASES``): SGLang's default
  tempered log-probs (``tempered/``) and the raw ones under ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``
  (``raw_logprobs/``); cut to their pairs as ``main_ppo/`` is.

* ``logits_loop/``: the CPU kit's RL loop (one global step, the four prompts packed into one step) sampled at
  temperature 0.8 (seeded), in tensor mode with whole sequences dumped (``DUMP_SEQUENCES=1``): the rollout's logits at
  every sampling step, each response token's two log-probs in the gap lines (``MSPROBE_HOOKS_GAP_TOKENS``' default
  ``dumped``). vLLM rolling out (``LOGITS_LOOP_CASES``): ``processed_logprobs`` against a trainer given 1.0
  (``tempered/``); with a top-p of 0.7 and the trainer at 0.8 (``top_p/``); ``raw_logprobs`` with the trainer at 0.8
  (``raw/``); ``processed_logprobs`` with the trainer at 0.8 (``alike/``: nothing differs); SGLang rolling out with
  ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``, the trainer at 0.8 (``sglang_raw/``). Cut to their pairs as ``main_ppo/`` is,
  and of the tensors to the ids, the final norm and the logits (the other rows compare on nothing: their files are
  left out), as ``.npy``.

* ``align/``: the join rules' inputs (``tests/analysis/test_align.py`` builds each case's dispatch log over
  them): ``actor/`` the README demo as its users run it (``msprobe-hooks run`` over ``examples/cpu_demo.py``,
  ``DUMP_ON=1 PROMPTS_ONLY=1``, msprobe's default config: four prompt-only dumps at level mix, request ids
  ``req-uid-0`` ... ``req-uid-3``); ``embedding/tokens{T}/`` real msprobe statistics dumps at L0 of a toy
  model whose embedding is named as vLLM's (``model.embed_tokens.VocabParallelEmbedding``, input ``[T]``),
  one per token count of ``EMBEDDING_TOKENS``: an inference step's dump of T tokens.

``--only SET`` re-cuts one set (``namings``, ``verdict``, ``decode``, ``megatron``, ``tp2``, ``replicas``, ``qwen3``,
``moe``, ``shared``, ``moe_sglang``, ``main_ppo``, ``sglang_loop``, ``logits_loop``, ``align``) and leaves the
others (``main_ppo`` needs ``.venv-verl-e2e``).

msprobe's ``stack.json`` and ``construct.json`` and the parameters' tensor files are dropped (compare reads
none of them); ``dump.json`` is rewritten as compact JSON, its content unchanged (but for the tensor files'
names, ``decode/``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [os.fspath(REPO / "tests"), os.fspath(REPO)]

from support.compare_runs import (  # noqa: E402
    msprobe_config,
    run_sglang,
    run_sglang_waves,
    run_training,
    run_vllm,
    run_vllm_scenario,
)
from support.interpreter import clean_env, shim_env  # noqa: E402
from support.real_vllm import PREEMPTION_ENGINE, PREEMPTION_REQUESTS  # noqa: E402
from support.rl_loop import TENSOR_CONFIG, TENSOR_ENV, demo_inputs_in, run_loop, run_sglang_loop  # noqa: E402

from cpu_kit import verl_cpu  # noqa: E402
from cpu_kit.main_ppo import TIMEOUT_S as MAIN_PPO_TIMEOUT_S  # noqa: E402
from cpu_kit.moe_inputs import perturb_weight  # noqa: E402

PROMPTS = [
    [5, 17, 42, 9, 77, 23],
    [64, 3, 31, 90],
]  # unequal lengths, and so are prompt + response (verl stacks equal ones)
PERTURBED = ("model.layers.1.mlp.down_proj.weight", 1.05)
README = "README.md"


def _copy_tree(source: Path, target: Path, rename=None, npy: bool = False) -> None:
    """``source`` to ``target``: logs, dump.json files (compact JSON, content unchanged) and activation tensors.

    ``rename`` rewrites module names. Parameter tensors are left out (compare never reads them). ``npy``
    writes each tensor file as ``.npy`` (numpy's format, which compare reads too; the names in dump.json
    follow): the same values, in a ~128-byte header instead of the ~2.4 KB of a ``.pt`` zip, the most of a
    tiny activation's file.
    """
    if npy:
        rename = _npy_name if rename is None else (lambda name: _npy_name(rename(name)))
    for path in sorted(source.rglob("*")):
        if path.is_dir() or path.name in ("stack.json", "construct.json") or ".parameters." in path.name:
            continue
        out = target / path.relative_to(source)
        if rename is not None and out.parent.name == "dump_tensor_data":
            out = out.with_name(rename(out.name))
        out.parent.mkdir(parents=True, exist_ok=True)
        if path.name == "dump.json":
            data = json.loads(path.read_text())
            if rename is not None:
                data["data"] = {rename(name): _renamed_files(entry, rename) for name, entry in data["data"].items()}
            out.write_text(json.dumps(data, separators=(",", ":")))
        elif npy and path.suffix == ".pt":
            _save_npy(path, out)
        else:
            shutil.copyfile(path, out)


def _npy_name(name: str) -> str:
    return f"{name[:-3]}.npy" if name.endswith(".pt") else name


def _save_npy(source: Path, out: Path) -> None:
    """A dumped ``.pt`` tensor as ``.npy``, its values exactly (numpy has no bfloat16: refused)."""
    import numpy
    import torch

    tensor = torch.load(source, map_location="cpu", weights_only=True)
    assert tensor.dtype != torch.bfloat16, f"{source}: bfloat16 has no .npy form"
    numpy.save(out, tensor.numpy(), allow_pickle=False)


def _renamed_files(entry: object, rename) -> object:
    """An entry with the tensor file names (``data_name``) it holds renamed too."""
    if isinstance(entry, dict):
        return {
            k: rename(v) if k == "data_name" and isinstance(v, str) else _renamed_files(v, rename)
            for k, v in entry.items()
        }
    if isinstance(entry, list):
        return [_renamed_files(v, rename) for v in entry]
    return entry


def fsdp1_name(name: str) -> str:
    """An FSDP2 module name as FSDP1 (one FSDP unit per decoder layer and one at the root) dumps it."""
    if not name.startswith("Module."):
        return name
    head, rest = name.split(".", 1)
    rest = f"_fsdp_wrapped_module.{rest}"
    parts = rest.split(".")
    for i in range(len(parts) - 1):
        if parts[i] == "layers" and parts[i + 1].isdigit() and i + 2 < len(parts) - 3:
            parts.insert(i + 2, "_fsdp_wrapped_module")
            break
    return f"{head}.{'.'.join(parts)}"


def _prompts(path: Path, prompts: list[list[int]]) -> Path:
    path.write_text(
        "".join(json.dumps({"request_id": f"req-{i}", "prompt_token_ids": p}) + "\n" for i, p in enumerate(prompts))
    )
    return path


# The verdict set: fp32 training against vLLM in fp32 and bf16, on the demo's 4-layer model, with planted
# changes of known place and size (docs/analysis.md, "The verdict"): (folder, vLLM dtype, weight, factor).
VERDICT_CASES = (
    ("fp32-clean", "float32", None, None),
    ("fp32-up_proj-1.01", "float32", "model.layers.1.mlp.up_proj.weight", 1.01),
    ("fp32-up_proj-1.03", "float32", "model.layers.1.mlp.up_proj.weight", 1.03),
    ("fp32-down_proj-1.01", "float32", "model.layers.1.mlp.down_proj.weight", 1.01),
    ("bf16-clean", "bfloat16", None, None),
    ("bf16-up_proj-1.03", "bfloat16", "model.layers.1.mlp.up_proj.weight", 1.03),
    ("bf16-up_proj-1.05", "bfloat16", "model.layers.1.mlp.up_proj.weight", 1.05),
    ("bf16-down_proj-1.02", "bfloat16", "model.layers.1.mlp.down_proj.weight", 1.02),
    ("bf16-q_proj-1.05", "bfloat16", "model.layers.2.self_attn.q_proj.weight", 1.05),
)


def _namings(work: Path, out: Path) -> None:
    model = Path(verl_cpu.build_model_dir(os.fspath(work / "model"), layers=2, hidden=64))
    perturbed = perturb_weight(model, work / "perturbed", *PERTURBED)
    prompts = _prompts(work / "prompts.jsonl", PROMPTS)
    stats = msprobe_config(work / "statistics.json")
    tensor = msprobe_config(work / "tensor.json", task="tensor")
    trees = {
        "fsdp2/actor": run_training(work / "fsdp2", model, prompts, stats),
        "vllm/generate": run_vllm(work / "vllm", model, prompts, stats),
        "vllm_perturbed/generate": run_vllm(work / "vllm_perturbed", perturbed, prompts, stats),
        "sglang/generate": run_sglang(work / "sglang", model, prompts, stats),
        "tensor/actor": run_training(work / "tensor-train", model, prompts, tensor),
        "tensor/generate": run_vllm(work / "tensor-vllm", model, prompts, tensor),
    }
    for name, tree in trees.items():
        _copy_tree(tree, out / name)
    _copy_tree(trees["fsdp2/actor"], out / "fsdp1" / "actor", rename=fsdp1_name)


def _verdict(work: Path, out: Path) -> None:
    from cpu_kit.demo_inputs import build_models, write_prompts

    model, _ = build_models(work / "inputs")
    prompts = write_prompts(work / "prompts.jsonl")
    stats = msprobe_config(work / "statistics.json")
    _copy_tree(run_training(work / "train", model, prompts, stats), out / "verdict" / "actor")
    for name, dtype, weight, factor in VERDICT_CASES:
        weights = perturb_weight(model, work / name, weight, factor) if weight else model
        _copy_tree(run_vllm(work / f"{name}-run", weights, prompts, stats, dtype), out / "verdict" / name / "generate")


# The decode set: (request id, prompt, tokens to generate). The packed requests: one alone for a step, then
# two more while it decodes (a decode row beside two prefills; then decode rows beside each other, the rows
# moving when one finishes). Then the preemption (support.real_vllm.PREEMPTION_REQUESTS in its small KV cache,
# PREEMPTION_ENGINE), on the same engine. Lengths unequal (verl stacks equal ones).
DECODE_PACKED = (
    ("req-0", [5, 17, 42, 9, 77, 23], 4),
    ("req-1", [64, 3, 31, 90], 2),
    ("req-2", [11, 58, 100, 7, 36], 3),
)
# Left out of the training dumps (DUMP_REQUEST_IDS), to keep the set small: pre-a (its sequence is 34 tokens)
# and pre-b; their samples are still in the batch (and the gap log), their rows in vLLM's steps.
DECODE_UNDUMPED = ("pre-a", "pre-b")
# SGLang packs the same requests into one EXTEND, chunked (8 tokens) and mixed with decode rows after it.
DECODE_SGLANG = {"enable_mixed_chunk": True, "chunked_prefill_size": 8}


def _requests(table: tuple[tuple[str, list[int], int], ...], length: str) -> list[dict]:
    return [{"id": rid, "prompt": prompt, length: tokens} for rid, prompt, tokens in table]


def _decode(work: Path, out: Path) -> None:
    model = Path(verl_cpu.build_model_dir(os.fspath(work / "model"), layers=2, hidden=64))
    waves = [_requests(DECODE_PACKED[:1], "max_tokens"), _requests(DECODE_PACKED[1:], "max_tokens")]
    waves.append(_requests(PREEMPTION_REQUESTS, "max_tokens"))
    scenario = {"model": os.fspath(model), "engine": PREEMPTION_ENGINE, "waves": waves, "wave_steps": [1, None, None]}
    scenario["logprobs"] = True
    # Which steps hold what is fixed by the waves (the engine core runs in the child's process): the packed
    # waves take steps 0-3; the preemption's wave starts at 4 (every prefill, pre-a's 30 tokens: left out),
    # pre-c's last decode before its preemption (6), its recompute (8, the step after pre-a finished at 7), the
    # decode after it (9).
    steps = [0, 1, 2, 3, 6, 8, 9]
    vllm_root, report = run_vllm_scenario(
        work / "vllm", scenario, msprobe_config(work / "vllm.json", task="tensor", step=steps)
    )
    (log,) = vllm_root.glob("*/dispatch_log.jsonl")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    resumed = [
        (line["step"], row) for line in lines for row in line["requests"] if row["prefill"] and row["type"] == "cached"
    ]
    assert [(step, row["request_id_base"], row["computed_tokens"]) for step, row in resumed] == [(8, "pre-c", 0)], (
        resumed
    )
    sglang_root, sglang_outputs = run_sglang_waves(
        work / "sglang",
        model,
        [_requests(DECODE_PACKED, "max_new_tokens")],
        msprobe_config(work / "sglang.json", task="tensor"),
        DECODE_SGLANG,
    )
    packed = {rid for rid, _, _ in DECODE_PACKED}
    assert sglang_outputs == {rid: ids for rid, ids in report["outputs"].items() if rid in packed}, sglang_outputs
    prompts = work / "rollout.jsonl"  # what the rollout made of each prompt, as RL hands it to training
    prompts.write_text(
        "".join(
            json.dumps(
                {
                    "request_id": rid,
                    "prompt_token_ids": prompt,
                    "response_token_ids": report["outputs"][rid],
                    "rollout_log_probs": report["logprobs"][rid],
                }
            )
            + "\n"
            for rid, prompt, _ in DECODE_PACKED + PREEMPTION_REQUESTS
        )
    )
    tensor = msprobe_config(work / "tensor.json", task="tensor")
    chosen = ",".join(rid for rid, _, _ in DECODE_PACKED + PREEMPTION_REQUESTS if rid not in DECODE_UNDUMPED)
    trees = {
        "actor": run_training(work / "train", model, prompts, tensor, DUMP_SEQUENCES="1", DUMP_REQUEST_IDS=chosen),
        # PROMPTS_ONLY=0: the real micro-batches; the first (req-0 and req-1, packed back to back) alone
        "actor_micro_batch": run_training(
            work / "train-micro-batch", model, prompts, tensor, PROMPTS_ONLY="0", DUMP_REQUEST_IDS="req-0"
        ),
        "vllm": vllm_root,
        "sglang": sglang_root,
    }
    for name, tree in trees.items():
        _copy_tree(tree, out / "decode" / name, npy=True)
    shutil.copyfile(prompts, out / "decode" / prompts.name)


def _megatron(work: Path, out: Path) -> None:
    from cpu_kit.demo_inputs import build_models, write_prompts

    model, perturbed = build_models(work / "inputs")
    prompts = write_prompts(work / "prompts.jsonl")
    stats = msprobe_config(work / "statistics.json")
    for tp in (1, 2):
        tree = run_training(work / f"tp{tp}", model, prompts, stats, engine="megatron", tensor_parallel=tp)
        _copy_tree(tree, out / "megatron" / f"tp{tp}" / "actor")
    runs = (
        ("vllm", model, "float32", 1),
        ("vllm_bf16", model, "bfloat16", 1),
        ("vllm_perturbed", perturbed, "float32", 1),
        ("vllm_tp2", model, "float32", 2),
    )
    for name, weights, dtype, tp in runs:
        tree = run_vllm(work / name, weights, prompts, stats, dtype, tp=tp)
        _copy_tree(tree, out / "megatron" / name / "generate")


# The TP sets' model: 4 query heads and 2 KV heads of 32 (TP 2 splits both), 2 layers.
TP2_MODEL = {"layers": 2, "hidden": 128}
TP2_GATE_UP = (("model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight"), 1.04)
REPLICA_PROMPTS = [*PROMPTS, [11, 12, 13, 14, 15], [99, 98, 97, 96, 95, 94, 93]]
REPLICAS = {"a": (1, (0, 2)), "b": (2, (1, 3))}  # replica -> (its TP size, the prompts it served)


def _scaled(model: Path, copy: Path, weights: tuple[str, ...], factor: float) -> Path:
    """A copy of ``model`` with each of ``weights`` scaled by ``factor``."""
    perturb_weight(model, copy, weights[0], factor)
    for weight in weights[1:]:
        perturb_weight(copy, copy.with_name(f"{copy.name}.next"), weight, factor)
        shutil.rmtree(copy)
        copy.with_name(f"{copy.name}.next").rename(copy)
    return copy


def _tp2(work: Path, out: Path) -> None:
    model = Path(verl_cpu.build_model_dir(os.fspath(work / "model"), **TP2_MODEL))
    prompts = _prompts(work / "prompts.jsonl", PROMPTS)
    stats = msprobe_config(work / "statistics.json")
    tensor = msprobe_config(work / "tensor.json", task="tensor")
    prefill_only = work / "tensor-prefill.json"  # one request at a time: the prefills are vLLM's steps 0 and 2
    prefill_only.write_text(json.dumps({**json.loads(Path(tensor).read_text()), "step": [0, 2]}))
    trees = {
        "actor": run_training(work / "train", model, prompts, stats),
        "vllm": run_vllm(work / "vllm", model, prompts, stats, tp=2),
        "vllm_gate_up": run_vllm(
            work / "gate_up", _scaled(model, work / "gate_up_model", *TP2_GATE_UP), prompts, stats, tp=2
        ),
        "sglang": run_sglang(work / "sglang", model, prompts, stats, tp=2),
        "tensor_actor": run_training(work / "tensor-train", model, prompts, tensor),
        "tensor_vllm": run_vllm(work / "tensor-vllm", model, prompts, os.fspath(prefill_only), tp=2),
    }
    for name, tree in trees.items():
        _copy_tree(tree, out / "tp2" / name)


def _replicas(work: Path, out: Path) -> None:
    model = Path(verl_cpu.build_model_dir(os.fspath(work / "model"), **TP2_MODEL))
    stats = msprobe_config(work / "statistics.json")
    everything = _prompts(work / "prompts.jsonl", REPLICA_PROMPTS)
    _copy_tree(run_training(work / "train", model, everything, stats, world_size=2), out / "replicas" / "actor")
    generate = work / "generate"
    for name, (tp, served) in REPLICAS.items():
        mine = work / f"{name}.jsonl"
        lines = everything.read_text().splitlines()
        mine.write_text("".join(lines[i] + "\n" for i in served))
        run_vllm(work / name, model, mine, stats, tp=tp, root=generate)
    _copy_tree(generate, out / "replicas" / "generate")


# Qwen3 (q/k norms) against vLLM and SGLang, and a k_norm fault; Qwen3-MoE with the routers' choices
# (MSPROBE_HOOKS_ROUTING=1 on vLLM): training in tensor mode (the routers' ids) and in statistics, vLLM in fp32
# and bf16, clean, with a router fault of known share (its router_fault.json beside) and a numeric fault.
ROUTING = {"MSPROBE_HOOKS_ROUTING": "1"}
MOE_ROUTER_SHARE = 0.3  # of the golden prompts' 10 tokens


def _qwen3(work: Path, out: Path) -> None:
    from cpu_kit.moe_inputs import QWEN3_NUMERIC_FAULT, build_qwen3_dir

    model = Path(build_qwen3_dir(os.fspath(work / "model")))
    fault = perturb_weight(model, work / "k_norm", *QWEN3_NUMERIC_FAULT)
    prompts = _prompts(work / "prompts.jsonl", PROMPTS)
    stats = msprobe_config(work / "statistics.json")
    trees = {
        "qwen3/actor": run_training(work / "train", model, prompts, stats),
        "qwen3/vllm/generate": run_vllm(work / "vllm", model, prompts, stats),
        "qwen3/sglang/generate": run_sglang(work / "sglang", model, prompts, stats),
        "qwen3/vllm_k_norm/generate": run_vllm(work / "vllm_k_norm", fault, prompts, stats),
    }
    for name, tree in trees.items():
        _copy_tree(tree, out / name)


def _moe(work: Path, out: Path) -> None:
    from cpu_kit.moe_inputs import (
        MOE_NUMERIC_FAULT,
        ROUTER_FAULT_FILE,
        build_qwen3_moe_dir,
        plant_router_fault,
    )

    model = Path(build_qwen3_moe_dir(os.fspath(work / "model")))
    router = work / "router"
    plant_router_fault(model, router, PROMPTS, share=MOE_ROUTER_SHARE)
    attention = perturb_weight(model, work / "attention", *MOE_NUMERIC_FAULT)
    prompts = _prompts(work / "prompts.jsonl", PROMPTS)
    stats = msprobe_config(work / "statistics.json")
    tensor = msprobe_config(work / "tensor.json", task="tensor")
    trees = {
        "moe/actor": run_training(work / "train", model, prompts, tensor),
        "moe/actor_statistics": run_training(work / "train_statistics", model, prompts, stats),
        "moe/fp32/generate": run_vllm(work / "fp32", model, prompts, stats, **ROUTING),
        "moe/router/generate": run_vllm(work / "router-run", router, prompts, stats, **ROUTING),
        "moe/attention/generate": run_vllm(work / "attention-run", attention, prompts, stats, **ROUTING),
        "moe/bf16/generate": run_vllm(work / "bf16", model, prompts, stats, "bfloat16", **ROUTING),
        "moe/bf16_router/generate": run_vllm(work / "bf16-router", router, prompts, stats, "bfloat16", **ROUTING),
        "moe/no_routing/generate": run_vllm(work / "no-routing", model, prompts, stats),
    }
    for name, tree in trees.items():
        _copy_tree(tree, out / name)
    shutil.copyfile(router / ROUTER_FAULT_FILE, out / "moe" / ROUTER_FAULT_FILE)
    keep_tensors(out / "moe" / "actor", lambda name: ".mlp.gate." in name and name.endswith((".0.pt", ".2.pt")))


def _shared(work: Path, out: Path) -> None:
    from cpu_kit.moe_inputs import build_qwen2_moe_dir

    model = Path(build_qwen2_moe_dir(os.fspath(work / "model")))
    prompts = _prompts(work / "prompts.jsonl", PROMPTS)
    stats = msprobe_config(work / "statistics.json")
    trees = {
        "shared_experts/actor": run_training(work / "train", model, prompts, stats),
        "shared_experts/vllm/generate": run_vllm(work / "vllm", model, prompts, stats),
    }
    for name, tree in trees.items():
        _copy_tree(tree, out / name)


def _moe_sglang(work: Path, out: Path) -> None:
    from cpu_kit.moe_inputs import build_qwen3_moe_dir

    model = Path(build_qwen3_moe_dir(os.fspath(work / "model")))  # the moe set's weights (same seed)
    prompts = _prompts(work / "prompts.jsonl", PROMPTS)
    tensor = msprobe_config(work / "tensor.json", task="tensor")
    _copy_tree(run_sglang(work / "sglang", model, prompts, tensor), out / "moe_sglang" / "generate")
    slim_to_prefill_routing(out / "moe_sglang" / "generate")


def keep_tensors(root: Path, keep) -> None:
    """Of a tensor-mode tree's tensor files, only those whose name ``keep`` accepts: what the routing tests read
    (a router's logits and ids); every other tensor compares on the statistics its dump.json holds, as it does
    against an inference side in statistics mode."""
    for path in root.rglob("*.pt"):
        if not keep(path.name):
            path.unlink()


def slim_to_prefill_routing(root: Path) -> None:
    """A tensor-mode inference tree cut to what its routing test reads: the prefill steps (the dispatch log
    says which; SGLang dumps every decode too) and, of the tensors, the TopK modules' expert ids. About 0.5 MB
    instead of 6."""
    for log in root.glob("*/dispatch_log.jsonl"):
        for line in map(json.loads, log.read_text().splitlines()):
            if not any(row.get("prefill") for row in line["requests"]):
                shutil.rmtree(log.parent / f"step{line['step']}", ignore_errors=True)
    keep_tensors(root, lambda name: ".mlp.topk." in name and name.endswith(".output.topk_ids.pt"))


EMBEDDING_TOKENS = (1, 2, 4, 5, 6, 7, 12)  # the demo's prompt lengths (4 to 7 tokens), their sums, one token
# A toy model whose embedding is named as vLLM's, dumped by real msprobe once per token count.
EMBEDDING_DUMPS = """
    import sys
    import torch
    from msprobe.pytorch import PrecisionDebugger

    class VocabParallelEmbedding(torch.nn.Embedding):
        pass

    class Body(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = VocabParallelEmbedding(128, 8)

        def forward(self, ids):
            return self.embed_tokens(ids)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Body()

        def forward(self, ids):
            return self.model(ids)

    config, out, *counts = sys.argv[1:]
    model = Model()
    debugger = PrecisionDebugger(config_path=config, dump_path=out)
    for count in counts:
        debugger.start(model=model, rank_id=0)
        model(torch.arange(int(count)))
        debugger.stop()
        debugger.step()
"""


# name: cpu_kit.main_ppo's overrides, each a real setting of verl's configuration (the v1 trainer, fp32 unless said)
BF16_FORWARD = "~actor_rollout_ref.actor.fsdp_config.mixed_precision"  # FSDP's default: a bf16 forward
MAIN_PPO_CASES = {
    "bf16_forward": [BF16_FORWARD],
    "bf16": [BF16_FORWARD, "actor_rollout_ref.rollout.dtype=bfloat16"],
    "bf16_raw_logprobs": [
        BF16_FORWARD,
        "actor_rollout_ref.rollout.dtype=bfloat16",
        "actor_rollout_ref.rollout.temperature=0.8",
        "actor_rollout_ref.rollout.logprobs_mode=raw_logprobs",
    ],
    "top_p": ["actor_rollout_ref.rollout.top_p=0.7"],
}


def _main_ppo(work: Path, out: Path) -> None:
    venv = REPO / ".venv-verl-e2e" / "bin"
    config = os.fspath(REPO / "examples" / "msprobe_l0.json")
    configs = {"MSPROBE_ACTOR_CONFIG": config, "MSPROBE_GENERATE_CONFIG": config}
    for name, options in MAIN_PPO_CASES.items():
        run = work / name
        env = shim_env(DUMP_ON="1", PROMPTS_ONLY="1", MSPROBE_HOOKS_OUTPUT_DIR=os.fspath(run / "dumps"), **configs)
        launch = [venv / "python", "-m", "cpu_kit.main_ppo", run, "--steps", "2", *options]
        subprocess.run(launch, env=env, cwd=REPO, check=True, timeout=2 * MAIN_PPO_TIMEOUT_S)
        align = [venv / "msprobe-hooks", "align", run / "dumps" / "actor", run / "dumps" / "generate"]
        subprocess.run([*align, "-o", run / "pairs.jsonl"], env=clean_env(), check=True, timeout=300)
        _cut_to_pairs(run, out / "main_ppo" / name)


# name: the SGLang rollout's environment (the CPU kit's RL loop, sampled at 0.8, verl recomputing at 0.8)
SGLANG_LOOP_CASES = {"tempered": {}, "raw_logprobs": {"SGLANG_RETURN_ORIGINAL_LOGPROB": "1"}}


def _sglang_loop(work: Path, out: Path) -> None:
    inputs = demo_inputs_in(work / "inputs")
    sampled = ["--temperature", "0.8", "--train-temperature", "0.8", "--iterations", "1"]
    for name, env in SGLANG_LOOP_CASES.items():
        run = run_sglang_loop(work / name, inputs, *sampled, **env)
        run.pairs()
        _cut_to_pairs(run.work, out / "sglang_loop" / name)


# name: the CPU kit's RL loop's options (sampled at 0.8, seeded, a step's requests packed), tensor mode with whole
# sequences dumped: the rollout's logits at every sampling step, each response token's log-probs in the gap lines
LOGITS_LOOP_SAMPLED = ("--temperature", "0.8", "--seed", "0", "--iterations", "1", "--packed")
LOGITS_LOOP_CASES = {
    "tempered": ["--logprobs-mode", "processed_logprobs", "--train-temperature", "1.0"],
    "top_p": ["--top-p", "0.7", "--logprobs-mode", "processed_logprobs", "--train-temperature", "0.8"],
    "raw": ["--logprobs-mode", "raw_logprobs", "--train-temperature", "0.8"],
    "alike": ["--logprobs-mode", "processed_logprobs", "--train-temperature", "0.8"],
}
# SGLang rolling out, returning the raw logits' log-probs (its environment), verl recomputing at 0.8
LOGITS_LOOP_SGLANG = ("sglang_raw", ["--train-temperature", "0.8"], {"SGLANG_RETURN_ORIGINAL_LOGPROB": "1"})


def _kept_for_logits(name: str) -> bool:
    """The tensors a logits_loop/ tree keeps: the ids, the final norm (the rows its pairs compare) and the logits."""
    top_level = ".layers." not in name
    return top_level and (".embed_tokens." in name or ".norm." in name or ".logits_processor." in name)


def _logits_loop(work: Path, out: Path) -> None:
    inputs = demo_inputs_in(work / "inputs")
    runs = [run_loop(work / n, inputs, *LOGITS_LOOP_SAMPLED, *o, **TENSOR_ENV) for n, o in LOGITS_LOOP_CASES.items()]
    name, options, env = LOGITS_LOOP_SGLANG
    sampled = (*LOGITS_LOOP_SAMPLED, *options)
    runs.append(run_sglang_loop(work / name, inputs, *sampled, msprobe=TENSOR_CONFIG, **TENSOR_ENV, **env))
    for run in runs:
        run.pairs()
        keep_tensors(run.work / "dumps", _kept_for_logits)
        _cut_to_pairs(run.work, out / "logits_loop" / run.work.name, npy=True)


def _cut_to_pairs(run: Path, target: Path, npy: bool = False) -> None:
    """The dumps ``run/pairs.jsonl`` pairs (paths relative to ``run``, under ``dumps/``) and the logs beside them,
    to ``target`` (``npy``: tensor files as ``.npy``); each side's log keeps the lines of the dumps kept (the other
    steps' folders are not)."""
    kept_steps: dict[str, set[int]] = {}
    logs: set[str] = set()
    for line in (run / "pairs.jsonl").read_text().splitlines():
        pair = json.loads(line)
        for side in (pair["train"], pair["generate"]):
            step_folder = Path(side["dump"]).parent
            _copy_tree(run / step_folder, target / step_folder.relative_to("dumps"), npy=npy)
            logs.update(filter(None, (side.get("engine_log"), side.get("requests_log"), *(side.get("gap_logs") or []))))
            kept_steps.setdefault(side["log"], set()).add(side["step"])
    for log in logs:
        out = target / Path(log).relative_to("dumps")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(run / log, out)
    for log, steps in kept_steps.items():
        lines = (run / log).read_text().splitlines(keepends=True)
        out = target / Path(log).relative_to("dumps")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(line for line in lines if json.loads(line)["step"] in steps))


def _align(work: Path, out: Path) -> None:
    demo = work / "demo"
    demo.mkdir(parents=True)
    command = [
        sys.executable,
        "-m",
        "msprobe_hooks",
        "run",
        "--",
        sys.executable,
        os.fspath(REPO / "examples/cpu_demo.py"),
    ]
    env = clean_env(DUMP_ON="1", PROMPTS_ONLY="1", OMP_NUM_THREADS="1")
    subprocess.run(command, env=env, cwd=demo, check=True, timeout=600)
    _copy_tree(demo / "msprobe_dump" / "actor", out / "align" / "actor")
    config = work / "config.json"
    config.write_text(json.dumps({"task": "statistics", "level": "L0", "rank": [], "step": [], "async_dump": False}))
    arguments = [os.fspath(config), os.fspath(work / "msprobe"), *map(str, EMBEDDING_TOKENS)]
    code = textwrap.dedent(EMBEDDING_DUMPS)
    subprocess.run([sys.executable, "-c", code, *arguments], env=clean_env(), check=True, timeout=300)
    for n, count in enumerate(EMBEDDING_TOKENS):
        _copy_tree(work / "msprobe" / f"step{n}" / "rank0", out / "align" / "embedding" / f"tokens{count}")


SETS = {
    "namings": _namings,
    "verdict": _verdict,
    "decode": _decode,
    "megatron": _megatron,
    "tp2": _tp2,
    "replicas": _replicas,
    "qwen3": _qwen3,
    "moe": _moe,
    "shared": _shared,
    "moe_sglang": _moe_sglang,
    "main_ppo": _main_ppo,
    "sglang_loop": _sglang_loop,
    "logits_loop": _logits_loop,
    "align": _align,
}


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=os.fspath(REPO / "tests" / "golden"))
    parser.add_argument("--only", action="append", choices=SETS, help="re-cut only this set (repeatable)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    chosen = args.only or list(SETS)
    with tempfile.TemporaryDirectory(prefix="golden-") as folder:
        staged = Path(folder) / "out"
        for name in chosen:
            SETS[name](Path(folder) / name, staged)
        for entry in staged.iterdir():  # only the sets made now are replaced
            if (out / entry.name).exists():
                shutil.rmtree(out / entry.name)
            shutil.copytree(entry, out / entry.name)
    (out / README).write_text(__doc__.split("\n\n", 2)[2].replace("``", "`"))
    sizes = {p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) for p in out.iterdir() if p.is_dir()}
    print("\n".join(f"{name}: {size / 1024:.0f} KiB" for name, size in sorted(sizes.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
