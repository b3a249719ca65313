"""Stand-in for sglang/srt/managers/tp_worker.py of 0.5.2."""

from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.model_runner import ModelRunner


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

    def forward_batch_generation(self, model_worker_batch, launch_done=None, skip_sample: bool = False):
        forward_batch = ForwardBatch.init_new(model_worker_batch, self.model_runner)
        logits_output, can_run_cuda_graph = self.model_runner.forward(forward_batch)
        next_token_ids = self.model_runner.sample(logits_output, forward_batch)
        return logits_output, next_token_ids, can_run_cuda_graph
