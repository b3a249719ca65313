import os
import tempfile

import torch

from vllm.utils import resolve_obj_by_qualname


class UniProcExecutor:
    """TP=1: the worker lives in this (engine-core) process, with a torch.distributed group of one."""

    def __init__(self, vllm_config) -> None:
        handle, path = tempfile.mkstemp(prefix="standin-dist-")
        os.close(handle)
        os.unlink(path)
        self.worker = resolve_obj_by_qualname(vllm_config.parallel_config.worker_cls)(
            vllm_config, distributed_init_method=f"file://{path}"
        )
        self.worker.init_device()
        self.worker.load_model()

    def execute_model(self, scheduler_output):
        return self.worker.execute_model(scheduler_output)

    def sample_tokens(self, grammar_output):
        return self.worker.sample_tokens(grammar_output)

    def shutdown(self) -> None:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
