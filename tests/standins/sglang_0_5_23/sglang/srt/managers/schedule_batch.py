"""Stand-in for sglang/srt/managers/schedule_batch.py of 0.5.23: Req and ScheduleBatch; no ModelWorkerBatch."""

import dataclasses
from array import array

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardMode


class Req:
    """The input and output status of a request."""

    def __init__(self, rid: str, origin_input_ids: list[int]):
        self.rid = rid
        self.origin_input_ids = array("i", origin_input_ids)
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

    @property
    def seq_lens_cpu(self) -> torch.Tensor:
        return self.seq_lens.cpu()
