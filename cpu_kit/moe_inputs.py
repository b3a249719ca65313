"""Beyond the dense Qwen2: a tiny Qwen3, a tiny Qwen3-MoE, faults planted in copies of them, prompts.

    python -m cpu_kit.moe_inputs FOLDER      (from the repository root, in .venv)

writes ``FOLDER/qwen3`` (2 layers, q/k norms), ``FOLDER/moe`` (a Qwen3-MoE: ``MOE_LAYERS`` layers of
``EXPERTS`` experts, top ``TOP_K``), ``FOLDER/moe-router`` (one router weight row scaled so that a known
share of the prompts' tokens goes to another expert set at ``ROUTER_LAYER``, what
:func:`plant_router_fault` computed is in its ``router_fault.json``), ``FOLDER/moe-attention`` (a numeric
fault: ``MOE_NUMERIC_FAULT``) and ``FOLDER/prompts.jsonl``. All load in verl's FSDP2 engine here and in
the real vLLM engine (``.venv-vllm``); head_dim 32 (vLLM's CPU attention refuses 16).

The planting device is the kit's, never part of msprobe-hooks: it computes, with the training model
itself (transformers, fp32), which tokens change their top-k expert set when one row of one router's
weight is scaled, and picks the row and the factor whose share of flipped tokens is nearest the one asked.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

HIDDEN = 128
QWEN3_LAYERS = 2
MOE_LAYERS = 3
EXPERTS = 8
TOP_K = 2
MOE_INTERMEDIATE = 64
PROMPT_LENS = (12, 16, 10, 14)  # 52 tokens: a router fault's share has a fine grain
ROUTER_LAYER = 1  # where the router fault is planted (layer 0 routes as before, layer 2 sees its effect)
ROUTER_SHARE = 0.25  # the share of that layer's tokens asked to flip
ROUTER_FAULT_FILE = "router_fault.json"
MOE_NUMERIC_FAULT = ("model.layers.1.self_attn.o_proj.weight", 1.05)
QWEN3_NUMERIC_FAULT = ("model.layers.1.self_attn.k_norm.weight", 1.05)


def _common(vocab: int, pad: int, eos: int) -> dict:
    return {
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "num_attention_heads": HIDDEN // 32,
        "num_key_value_heads": HIDDEN // 64,
        "head_dim": 32,
        "max_position_embeddings": 512,
        "pad_token_id": pad,
        "eos_token_id": eos,
        "bos_token_id": eos,
        "tie_word_embeddings": False,
    }


def build_qwen3_dir(path: str, seed: int = 0, layers: int = QWEN3_LAYERS) -> str:
    """A tiny random Qwen3 (q_norm/k_norm) with the kit's tokenizer, saved under ``path`` (reused if present)."""
    return _build(path, seed, "qwen3", layers)


def build_qwen3_moe_dir(path: str, seed: int = 0, layers: int = MOE_LAYERS) -> str:
    """A tiny random Qwen3-MoE (``EXPERTS`` experts, top ``TOP_K``, no shared expert), saved under ``path``."""
    return _build(path, seed, "qwen3_moe", layers)


def build_qwen2_moe_dir(path: str, seed: int = 0, layers: int = 2) -> str:
    """A tiny random Qwen2-MoE: ``EXPERTS`` routed experts, top ``TOP_K``, and a gated shared expert."""
    return _build(path, seed, "qwen2_moe", layers)


def _build(path: str, seed: int, kind: str, layers: int) -> str:
    import torch
    from transformers import (
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    from cpu_kit import verl_cpu

    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    verl_cpu.write_tokenizer(path)
    common = _common(verl_cpu.VOCAB_SIZE, verl_cpu.PAD_TOKEN_ID, verl_cpu.EOS_TOKEN_ID)
    experts = dict(  # both MoE kinds: every layer sparse, the top-k weights normalised
        intermediate_size=2 * HIDDEN,
        moe_intermediate_size=MOE_INTERMEDIATE,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        num_hidden_layers=layers,
    )
    if kind == "qwen3":
        config, cls = Qwen3Config(intermediate_size=2 * HIDDEN, num_hidden_layers=layers, **common), Qwen3ForCausalLM
    elif kind == "qwen2_moe":
        common.pop("head_dim")  # Qwen2: hidden / heads
        config = Qwen2MoeConfig(shared_expert_intermediate_size=2 * MOE_INTERMEDIATE, **experts, **common)
        cls = Qwen2MoeForCausalLM
    else:
        config = Qwen3MoeConfig(**experts, **common)
        cls = Qwen3MoeForCausalLM
    torch.manual_seed(seed)
    model = cls(config)
    if kind != "qwen3":  # random routers at init are near zero: give the choice real margins
        with torch.no_grad():
            for layer in model.model.layers:
                layer.mlp.gate.weight.normal_(0.0, 0.3)
    model.save_pretrained(path, safe_serialization=True)
    return path


def perturb_weight(model: Path, copy: Path, weight: str, factor: float) -> Path:
    """A copy of the model folder ``model`` with the tensor ``weight`` scaled by ``factor``."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model, copy, dirs_exist_ok=True)
    weights = load_file(os.fspath(model / "model.safetensors"))
    weights[weight] = weights[weight] * factor
    save_file(weights, os.fspath(copy / "model.safetensors"), metadata={"format": "pt"})
    return copy


def write_prompts(path: Path, lens: tuple[int, ...] = PROMPT_LENS, seed: int = 0) -> Path:
    """``{"request_id", "prompt_token_ids"}`` a line (the file ``cpu_demo.py`` and ``vllm_generate.py`` read)."""
    from cpu_kit import verl_cpu

    rng = random.Random(seed)
    with path.open("w") as out:
        for i, length in enumerate(lens):
            ids = [rng.randrange(3, verl_cpu.VOCAB_SIZE) for _ in range(length)]
            out.write(json.dumps({"request_id": f"req-{i}", "prompt_token_ids": ids}) + "\n")
    return path


@dataclass(frozen=True)
class RouterFault:
    """What :func:`plant_router_fault` did: which row of which router, by what factor, and its effect there."""

    layer: int
    expert: int
    scale: float
    tokens: int  # the prompts' tokens (each prompt's forward alone, as the prefill and the prompt-only dump)
    flipped: int  # of them, those whose top-k expert set at ``layer`` changes
    share: float  # flipped / tokens

    def write(self, folder: Path) -> Path:
        path = folder / ROUTER_FAULT_FILE
        path.write_text(json.dumps(asdict(self)) + "\n")
        return path

    @classmethod
    def read(cls, folder: Path) -> RouterFault:
        return cls(**json.loads((folder / ROUTER_FAULT_FILE).read_text()))


def router_inputs(model_dir: Path, prompts: list[list[int]], layer: int) -> tuple[object, object]:
    """The hidden states entering ``layer``'s router for every prompt token, and that router's weight (fp32)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(os.fspath(model_dir), dtype=torch.float32, attn_implementation="eager")
    model.eval()
    gate = model.model.layers[layer].mlp.gate
    seen: list[torch.Tensor] = []
    handle = gate.register_forward_hook(lambda module, args, out: seen.append(args[0].reshape(-1, args[0].shape[-1])))
    with torch.no_grad():
        for ids in prompts:
            model(torch.tensor([ids]))
    handle.remove()
    return torch.cat(seen), gate.weight.detach().clone()


def _flips(hidden, weight, expert: int, scale: float, top_k: int):
    import torch

    logits = hidden @ weight.T
    changed = logits.clone()
    changed[:, expert] *= scale
    before = torch.topk(logits, top_k, dim=-1).indices.sort(dim=-1).values
    after = torch.topk(changed, top_k, dim=-1).indices.sort(dim=-1).values
    return (before != after).any(dim=-1)


def plant_router_fault(
    model: Path, copy: Path, prompts: list[list[int]], layer: int = ROUTER_LAYER, share: float = ROUTER_SHARE
) -> RouterFault:
    """A copy of ``model`` with one row of ``layer``'s router weight scaled so that the share of the prompts'
    tokens whose top-k expert set changes there is as near ``share`` as one row and one factor allow."""
    hidden, weight = router_inputs(model, prompts, layer)
    tokens = hidden.shape[0]
    best: tuple[float, float, int, float, int] | None = None  # (distance, |scale - 1|, expert, scale, flipped)
    for expert in range(weight.shape[0]):
        for step in range(1, 61):
            for scale in (1 + step / 20, 1 - step / 20):
                flipped = int(_flips(hidden, weight, expert, scale, TOP_K).sum())
                key = (abs(flipped / tokens - share), abs(scale - 1), expert, scale, flipped)
                if best is None or key[:2] < best[:2]:
                    best = key
    assert best is not None
    _, _, expert, scale, flipped = best
    perturb_weight(model, copy, f"model.layers.{layer}.mlp.gate.weight", 1.0)  # the copy, then the row
    from safetensors.torch import load_file, save_file

    weights = load_file(os.fspath(copy / "model.safetensors"))
    name = f"model.layers.{layer}.mlp.gate.weight"
    weights[name][expert] *= scale
    save_file(weights, os.fspath(copy / "model.safetensors"), metadata={"format": "pt"})
    fault = RouterFault(layer, expert, scale, tokens, flipped, flipped / tokens)
    fault.write(copy)
    return fault


def read_prompt_ids(path: Path) -> list[list[int]]:
    from cpu_kit.demo_inputs import read_prompts

    return [p["prompt_token_ids"] for p in read_prompts(os.fspath(path))]


def main() -> int:
    folder = Path(sys.argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    prompts = write_prompts(folder / "prompts.jsonl")
    qwen3 = Path(build_qwen3_dir(os.fspath(folder / "qwen3")))
    perturb_weight(qwen3, folder / "qwen3-k_norm", *QWEN3_NUMERIC_FAULT)
    moe = Path(build_qwen3_moe_dir(os.fspath(folder / "moe")))
    perturb_weight(moe, folder / "moe-attention", *MOE_NUMERIC_FAULT)
    fault = plant_router_fault(moe, folder / "moe-router", read_prompt_ids(prompts))
    print(f"qwen3: {qwen3}\nmoe: {moe}\nprompts: {prompts}")
    print(
        f"moe-router: layer {fault.layer} router row {fault.expert} x{fault.scale:g}: "
        f"{fault.flipped} of {fault.tokens} tokens ({fault.share:.1%}) change their experts"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
