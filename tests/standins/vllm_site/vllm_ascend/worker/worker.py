"""Stand-in for vllm_ascend/worker/worker.py: NPUWorker applies vLLM-Ascend's worker patches first."""

import torch
from vllm.v1.worker.gpu_worker import Worker

from vllm_ascend.worker.model_runner_v1 import NPUModelRunner


def adapt_patch() -> None:
    from vllm_ascend.patch import worker  # noqa: F401  (patches vLLM on import)


class NPUWorker(Worker):
    def __init__(self, vllm_config, local_rank: int = 0, rank: int = 0, distributed_init_method: str | None = None):
        super().__init__(vllm_config, local_rank, rank, distributed_init_method)
        adapt_patch()

    def _make_model_runner(self):
        return NPUModelRunner(self.vllm_config, torch.device("cpu"))
