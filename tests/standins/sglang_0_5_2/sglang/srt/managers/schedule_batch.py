"""Stand-in for sglang/srt/managers/schedule_batch.py of 0.5.2: Req, ScheduleBatch, ModelWorkerBatch (no reqs)."""

import dataclasses

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardMode

bid = 0


class Req:
    """The input and output status of a request."""

    def __init__(self, rid: str, origin_input_ids: list[int]):
        self.rid = rid
        self.origin_input_ids = origin_input_ids
        self.output_ids = []
        self.prefix_indices = []


@dataclasses.dataclass
class ScheduleBatch:
    """Store all information of a batch on the scheduler."""

    reqs: list[Req]
    forward_mode: ForwardMode = None
    input_ids: torch.Tensor = None
    seq_lens: torch.Tensor = None
    prefix_lens: list[int] = None
    extend_lens: list[int] = None

    def get_model_worker_batch(self, seq_lens_cpu_cache: torch.Tensor | None = None):
        global bid
        bid += 1
        decode_or_idle = self.forward_mode in (ForwardMode.DECODE, ForwardMode.IDLE)
        return ModelWorkerBatch(
            bid=bid,
            forward_mode=self.forward_mode,
            input_ids=self.input_ids,
            seq_lens=self.seq_lens,
            seq_lens_cpu=seq_lens_cpu_cache if seq_lens_cpu_cache is not None else self.seq_lens.cpu(),
            extend_seq_lens=None if decode_or_idle else self.extend_lens,
            extend_prefix_lens=None if decode_or_idle else self.prefix_lens,
        )


@dataclasses.dataclass
class ModelWorkerBatch:
    bid: int
    forward_mode: ForwardMode
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor | None
    extend_seq_lens: list[int] | None
    extend_prefix_lens: list[int] | None
