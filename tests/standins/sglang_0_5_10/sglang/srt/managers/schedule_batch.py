"""Stand-in for sglang/srt/managers/schedule_batch.py of 0.5.10: the ModelWorkerBatch holds its requests (0.5.6+).

0.5.11 has the same (its file is a link to this one).
"""

import dataclasses

import torch
from sglang_common import ReqBase, ScheduleBatchBase, WorkerBatchBase


class Req(ReqBase):
    """The input and output status of a request."""


@dataclasses.dataclass
class ScheduleBatch(ScheduleBatchBase):
    """Store all information of a batch on the scheduler."""

    def get_model_worker_batch(self, seq_lens_cpu_cache: torch.Tensor | None = None):
        return ModelWorkerBatch.of(self, seq_lens_cpu_cache, reqs=self.reqs)


@dataclasses.dataclass
class ModelWorkerBatch(WorkerBatchBase):
    """The batch the scheduler hands the model worker."""

    # For constrained decoding
    reqs: list[Req] | None = None
