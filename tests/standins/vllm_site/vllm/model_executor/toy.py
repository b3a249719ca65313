"""The model the stand-in serves: a tiny LM over packed tokens (no attention, so no KV cache needed)."""

import torch
from torch import nn


class ToyDecoderLayer(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.mlp = nn.Linear(hidden, hidden)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + torch.tanh(self.mlp(self.norm(hidden_states)))


class ToyRotaryEmbedding(nn.Module):
    """Shaped like vLLM's RotaryEmbedding (``base``, ``rotary_dim``); the toy adds positions instead."""

    def __init__(self, rotary_dim: int, base: float) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim
        self.base = base


class ToyForCausalLM(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, num_layers: int = 2, rope_theta: float = 10000.0) -> None:
        super().__init__()
        self.rotary_emb = ToyRotaryEmbedding(hidden_size, rope_theta)
        self.embed_tokens = nn.Embedding(vocab_size, hidden_size)
        self.layers = nn.ModuleList(ToyDecoderLayer(hidden_size) for _ in range(num_layers))
        self.lm_head = nn.Linear(hidden_size, vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids) + 0.01 * positions.unsqueeze(-1).float()
        for layer in self.layers:
            hidden = layer(hidden)
        return hidden

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)
