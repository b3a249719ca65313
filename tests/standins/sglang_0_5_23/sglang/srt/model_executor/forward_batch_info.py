"""Stand-in for sglang/srt/model_executor/forward_batch_info.py of 0.5.23: init_new takes the ScheduleBatch."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, auto

import torch
from tiny_lm import positions_of


class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()
    MIXED = auto()
    IDLE = auto()
    TARGET_VERIFY = auto()
    DRAFT_EXTEND_V2 = auto()
    PREBUILT = auto()
    SPLIT_PREFILL = auto()
    DLLM_EXTEND = auto()

    def is_extend(self):
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY, ForwardMode.SPLIT_PREFILL)

    def is_decode(self):
        return self == ForwardMode.DECODE

    def is_idle(self):
        return self == ForwardMode.IDLE


@dataclass
class ForwardBatch:
    """Store all inputs of a forward pass."""

    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor | None = None
    positions: torch.Tensor = None
    rids: list[str] | None = None
    # extend-mode-only fields are None on decode/idle
    extend_prefix_lens_cpu: list[int] | None = None
    extend_seq_lens_cpu: list[int] | None = None

    @classmethod
    def init_new(cls, batch, model_runner, *, capture_hidden_mode=None, return_hidden_states_before_norm=False):
        seq_lens_cpu = batch.seq_lens_cpu
        ret = cls(
            forward_mode=batch.forward_mode,
            batch_size=len(batch.seq_lens),
            input_ids=batch.input_ids,
            seq_lens=batch.seq_lens,
            seq_lens_cpu=seq_lens_cpu,
            rids=[req.rid for req in batch.reqs],
        )
        if not ret.forward_mode.is_decode() and not ret.forward_mode.is_idle():
            ret.extend_prefix_lens_cpu = list(batch.prefix_lens)
            ret.extend_seq_lens_cpu = list(batch.extend_lens)
        ret.positions = positions_of(ret.extend_prefix_lens_cpu, ret.extend_seq_lens_cpu, seq_lens_cpu.tolist())
        return ret
