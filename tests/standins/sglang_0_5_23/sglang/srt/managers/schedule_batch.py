"""Stand-in for sglang/srt/managers/schedule_batch.py of 0.5.23: Req and ScheduleBatch; no ModelWorkerBatch."""

import dataclasses
from array import array

import torch
from sglang_common import ReqBase, ScheduleBatchBase


class Req(ReqBase):
    """The input and output status of a request."""

    def __init__(self, rid: str, origin_input_ids: list[int]):
        super().__init__(rid, array("i", origin_input_ids))


@dataclasses.dataclass
class ScheduleBatch(ScheduleBatchBase):
    """Store all information of a batch on the scheduler; from 0.5.13 the model worker gets it as is."""

    @property
    def seq_lens_cpu(self) -> torch.Tensor:
        return self.seq_lens.cpu()
