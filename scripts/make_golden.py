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

``--only SET`` re-cuts one set (``namings``, ``verdict``, ``decode``) and leaves the others.

msprobe's ``stack.json`` and ``construct.json`` and the parameters' tensor files are dropped (compare reads
none of them); ``dump.json`` is rewritten as compact JSON, its content unchanged (but for the tensor files'
names, ``decode/``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
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
from support.real_vllm import PREEMPTION_ENGINE, PREEMPTION_REQUESTS  # noqa: E402

from cpu_kit import verl_cpu  # noqa: E402

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


def _perturb(model: Path, copy: Path, weight: str, factor: float) -> Path:
    """A copy of ``model`` with ``weight`` scaled by ``factor``."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model, copy, dirs_exist_ok=True)
    weights = load_file(os.fspath(model / "model.safetensors"))
    weights[weight] = weights[weight] * factor
    save_file(weights, os.fspath(copy / "model.safetensors"), metadata={"format": "pt"})
    return copy


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
    perturbed = _perturb(model, work / "perturbed", *PERTURBED)
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
        weights = _perturb(model, work / name, weight, factor) if weight else model
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


SETS = {"namings": _namings, "verdict": _verdict, "decode": _decode}


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
