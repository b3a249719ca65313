"""Tiny random models under the Hugging Face hub names vLLM's own tests load, in a hub cache of their own.

    .venv-vllm/bin/python -m cpu_kit.hub_models HF_HOME

writes ``HF_HOME/hub/models--ORG--NAME/{refs/main,snapshots/COMMIT/...}`` for every name of :data:`MODELS`, so
that ``HF_HOME=... HF_HUB_OFFLINE=1`` answers them with no network (``make vllm-tests``;
tests/faults/test_vllm_own_suite.py). Deterministic: fixed seeds, a fixed commit, a fixed vocabulary.

The tokenizer is word-level (whitespace pre-tokenizer, no decoder): every token decodes to one word and words are
joined by spaces, so tests that split generated text by whitespace and stop on the Nth word work on a random model.
Its words are those of the tests' prompts and JSON's booleans, then fillers of one length (``w00042``): no word is
a part of another, so a generated word used as a stop string matches only itself.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # a fake revision: refs/main points at it
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0-3: unk, bos, eos, pad
# The words of the tests' own prompts, to be words of the vocabulary rather than <unk>; and JSON's booleans, which
# a structured-output test's grammar must be able to spell.
PROMPTS = "Hello my name is Robert and I / The capital of France is / The future of AI is / The president of the United"
GRAMMAR_WORDS = "true false"
VOCAB_SIZE = 32000  # the tests name token ids up to 31999 (allowed_token_ids)
SMALL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 128,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 2048,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 3,
    "tie_word_embeddings": False,
}
_OPT = {
    **{k: SMALL[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")},
    **{k: SMALL[k] for k in ("max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id")},
    "ffn_dim": 128,
    "word_embed_proj_dim": 64,
    "tie_word_embeddings": False,  # tied, a random tiny OPT or GPT-2 only repeats its input
}
_GPT2 = {
    **{k: SMALL[k] for k in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings")},
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 2,
    "n_inner": 128,
    "n_positions": 1024,
}
# Hub name -> (transformers config class, its arguments, whether its tokenizer puts <s> first as the real one does).
MODELS: dict[str, tuple[str, dict, bool]] = {
    "hmellor/tiny-random-LlamaForCausalLM": ("LlamaConfig", SMALL, True),
    "JackFram/llama-160m": ("LlamaConfig", SMALL, True),
    "meta-llama/Llama-3.2-1B": ("LlamaConfig", SMALL, True),
    "meta-llama/Llama-3.2-1B-Instruct": ("LlamaConfig", SMALL, True),
    "facebook/opt-125m": ("OPTConfig", _OPT, True),
    "distilbert/distilgpt2": ("GPT2Config", _GPT2, False),
}
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def vocabulary() -> dict[str, int]:
    words = [*SPECIALS, *dict.fromkeys(f"{PROMPTS.replace('/', ' ')} {GRAMMAR_WORDS}".split())]
    words += [f"w{i:05d}" for i in range(len(words), VOCAB_SIZE)]
    return {word: i for i, word in enumerate(words)}


def write_tokenizer(folder: Path, bos_first: bool) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tokenizer = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token=SPECIALS[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    if bos_first:
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.save(os.fspath(folder / "tokenizer.json"))
    specials = {"unk_token": SPECIALS[0], "bos_token": SPECIALS[1], "eos_token": SPECIALS[2], "pad_token": SPECIALS[3]}
    # transformers 5 would otherwise build the model type's own (BPE) tokenizer class around tokenizer.json.
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
        **specials,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=1))


def build(hf_home: Path, name: str) -> Path:
    """``name``'s snapshot in the hub cache under ``hf_home``: config, random weights (seed 0), tokenizer."""
    import torch
    import transformers

    repo = hf_home / "hub" / f"models--{name.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    config_class, arguments, bos_first = MODELS[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**arguments)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(snapshot)
    write_tokenizer(snapshot, bos_first)
    return snapshot


def main(argv: list[str]) -> int:
    (hf_home,) = argv
    for name in MODELS:
        print(f"{name}: {build(Path(hf_home).resolve(), name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
