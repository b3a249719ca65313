"""The model every SGLang stand-in runs: small, seeded, CPU, with module names like a decoder LM."""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 64


class TinyDecoderLayer(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.mlp = nn.Linear(hidden, hidden)
        self.post_attention_layernorm = nn.LayerNorm(hidden)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + torch.tanh(self.post_attention_layernorm(self.mlp(hidden_states)))


class TinyLM(nn.Module):
    """``forward(input_ids, positions, forward_batch)`` over the flattened tokens of a batch, as SGLang models."""

    def __init__(self, hidden: int = 16, layers: int = 2) -> None:
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(0)  # the same weights in every process
        self.embed_tokens = nn.Embedding(VOCAB, hidden)
        self.layers = nn.ModuleList(TinyDecoderLayer(hidden) for _ in range(layers))
        self.lm_head = nn.Linear(hidden, VOCAB, bias=False)
        torch.random.set_rng_state(generator_state)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: object) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids) + 0.01 * positions[:, None].float()
        for layer in self.layers:
            hidden = layer(hidden)
        return self.lm_head(hidden)


def positions_of(extend_prefix_lens: list[int] | None, extend_seq_lens: list[int] | None, seq_lens: list[int]):
    """Token positions of a flattened batch: extend rows continue after their prefix, decode rows at seq_len - 1."""
    if extend_seq_lens is None:
        return torch.tensor([n - 1 for n in seq_lens], dtype=torch.int64)
    parts = [torch.arange(p, p + n) for p, n in zip(extend_prefix_lens, extend_seq_lens, strict=True)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)


def last_token_logits(logits: torch.Tensor, tokens_per_row: list[int]) -> torch.Tensor:
    ends = torch.tensor(tokens_per_row).cumsum(0) - 1
    return logits[ends]
