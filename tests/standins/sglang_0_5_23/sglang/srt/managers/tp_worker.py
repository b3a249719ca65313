"""Stand-in for sglang/srt/managers/tp_worker.py of 0.5.23: the ForwardBatch is built from the ScheduleBatch."""

from sglang_common import GenerationBatchResult

from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.runtime_context import set_context


class TpModelWorker:
    """A tensor parallel model worker."""

    def __init__(self, server_args, gpu_id: int, tp_rank: int):
        set_context(server_args, tp_rank)  # the scheduler process does this at start-up
        self.model_runner = ModelRunner(None, 0.8, gpu_id, nccl_port=0, server_args=server_args)

    def forward_batch_generation(
        self,
        batch,
        forward_batch=None,
        pp_proxy_tensors=None,
        is_verify: bool = False,
        skip_attn_backend_init=None,
        *,
        capture_hidden_mode=None,
        return_kv_loc_plan: bool = False,
    ):
        if batch is not None:
            forward_batch = ForwardBatch.init_new(batch, self.model_runner, capture_hidden_mode=capture_hidden_mode)
        out = self.model_runner.forward(forward_batch, pp_proxy_tensors=pp_proxy_tensors)
        next_token_ids = self.model_runner.sample(out.logits_output, forward_batch)
        return GenerationBatchResult(out.logits_output, next_token_ids, out.can_run_graph)
