"""The inputs of the whole-loop demo: one tiny Qwen2, a copy of it with one planted fault, and prompts.

    python -m cpu_kit.demo_inputs FOLDER      (from the repository root)

writes ``FOLDER/model`` (a random 4-layer Qwen2, head_dim 32 as vLLM's CPU attention needs),
``FOLDER/perturbed`` (the same weights with ``PERTURBED_MODULE`` scaled by ``PERTURBATION``: the
kind of fault a broken weight sync or checkpoint conversion plants in the rollout engine) and
``FOLDER/prompts.jsonl`` (``{"request_id", "prompt_token_ids"}`` per line, the file both
``examples/cpu_demo.py --prompts`` and ``examples/vllm_generate.py`` read, with :func:`read_prompts`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from pathlib import Path

LAYERS = 4
HIDDEN = 128
# The module the perturbed copy changes, and by how much (its output is then off by 0.05 / 1.05).
PERTURBED_MODULE = "layers.1.mlp.down_proj"
PERTURBATION = 1.05
PROMPT_LENS = (6, 9, 5, 8)  # four prompts: verl's micro-batches of two must divide the batch
# Qwen2.5-0.5B's shape (its config.json), for a random checkpoint of real size made here (no download):
# verl_cpu.build_model_dir(folder, **QWEN2_5_0_5B). 494 M parameters, 0.99 GB in bfloat16.
QWEN2_5_0_5B = {
    "layers": 24,
    "hidden": 896,
    "heads": 14,
    "kv_heads": 2,
    "intermediate": 4864,
    "vocab": 151936,
    "tie_word_embeddings": True,
}


def build_models(folder: Path) -> tuple[Path, Path]:
    """``folder/model`` and ``folder/perturbed``."""
    from safetensors.torch import load_file, save_file

    from cpu_kit import verl_cpu  # here: vllm_generate.py reads prompts with this module, in vLLM's venv

    model = Path(verl_cpu.build_model_dir(os.fspath(folder / "model"), layers=LAYERS, hidden=HIDDEN))
    perturbed = folder / "perturbed"
    shutil.copytree(model, perturbed, dirs_exist_ok=True)
    weights = load_file(os.fspath(model / "model.safetensors"))
    weights[f"model.{PERTURBED_MODULE}.weight"] = weights[f"model.{PERTURBED_MODULE}.weight"] * PERTURBATION
    save_file(weights, os.fspath(perturbed / "model.safetensors"), metadata={"format": "pt"})
    return model, perturbed


def read_prompts(path: str) -> list[dict]:
    """The prompts file: one ``{"request_id", "prompt_token_ids"}`` object a line."""
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def write_prompts(path: Path) -> Path:
    rng = random.Random(0)
    with path.open("w") as out:
        for i, length in enumerate(PROMPT_LENS):
            ids = [rng.randrange(3, 128) for _ in range(length)]
            out.write(json.dumps({"request_id": f"req-{i}", "prompt_token_ids": ids}) + "\n")
    return path


def main() -> int:
    folder = Path(sys.argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    model, perturbed = build_models(folder)
    prompts = write_prompts(folder / "prompts.jsonl")
    print(f"model: {model}\nperturbed copy ({PERTURBED_MODULE} x{PERTURBATION}): {perturbed}\nprompts: {prompts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
