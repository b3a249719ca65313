"""Stand-in for sglang/srt/managers/tp_worker.py of 0.5.11."""

from dataclasses import dataclass

from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.model_runner import ModelRunner


@dataclass
class GenerationBatchResult:
    logits_output: object
    next_token_ids: list
    can_run_cuda_graph: bool


class TpModelWorker:
    """A tensor parallel model worker."""

    def __init__(self, server_args, gpu_id: int, tp_rank: int, moe_ep_rank: int = 0, pp_rank: int = 0, dp_rank=None):
        self.model_runner = ModelRunner(
            model_config=None,
            mem_fraction_static=0.8,
            gpu_id=gpu_id,
            tp_rank=tp_rank,
            tp_size=server_args.tp_size,
            moe_ep_rank=moe_ep_rank,
            moe_ep_size=1,
            pp_rank=pp_rank,
            pp_size=1,
            nccl_port=0,
            server_args=server_args,
            dp_rank=dp_rank,
        )

    def forward_batch_generation(self, model_worker_batch, forward_batch=None, is_verify: bool = False):
        forward_batch = ForwardBatch.init_new(model_worker_batch, self.model_runner)
        out = self.model_runner.forward(forward_batch)
        next_token_ids = self.model_runner.sample(out.logits_output, forward_batch)
        return GenerationBatchResult(out.logits_output, next_token_ids, out.can_run_graph)
