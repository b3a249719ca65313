"""Stand-in for vllm/v1/worker/gpu_worker.py: one worker per rank; picks the V1 or V2 runner."""

import os

import torch


class Worker:
    def __init__(self, vllm_config, local_rank: int = 0, rank: int = 0, distributed_init_method: str | None = None):
        self.vllm_config = vllm_config
        self.rank = rank
        self.distributed_init_method = distributed_init_method

    def init_device(self) -> None:
        if self.distributed_init_method is not None:
            torch.distributed.init_process_group(
                "gloo",
                init_method=self.distributed_init_method,
                rank=self.rank,
                world_size=self.vllm_config.parallel_config.world_size,
            )
        self.model_runner = self._make_model_runner()

    def _make_model_runner(self):
        if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1":
            from vllm.v1.worker.gpu.model_runner import GPUModelRunner as GPUModelRunnerV2

            return GPUModelRunnerV2(self.vllm_config, torch.device("cpu"))
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        return GPUModelRunner(self.vllm_config, torch.device("cpu"))

    def load_model(self) -> None:
        self.model_runner.load_model()

    def execute_model(self, scheduler_output):
        return self.model_runner.execute_model(scheduler_output)

    def sample_tokens(self, grammar_output):
        return self.model_runner.sample_tokens(grammar_output)
