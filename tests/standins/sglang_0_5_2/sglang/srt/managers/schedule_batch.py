"""Stand-in for sglang/srt/managers/schedule_batch.py of 0.5.2: the ModelWorkerBatch holds no requests."""

import dataclasses

import torch
from sglang_common import ReqBase, ScheduleBatchBase, WorkerBatchBase


class Req(ReqBase):
    """The input and output status of a request."""


@dataclasses.dataclass
class ScheduleBatch(ScheduleBatchBase):
    """Store all information of a batch on the scheduler."""

    def get_model_worker_batch(self, seq_lens_cpu_cache: torch.Tensor | None = None):
        return ModelWorkerBatch.of(self, seq_lens_cpu_cache)


@dataclasses.dataclass
class ModelWorkerBatch(WorkerBatchBase):
    """The batch the scheduler hands the model worker."""
