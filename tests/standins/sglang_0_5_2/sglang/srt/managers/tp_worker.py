"""Stand-in for sglang/srt/managers/tp_worker.py of 0.5.2: forward_batch_generation returns a tuple."""

from sglang_common import TpModelWorkerBase

from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.model_runner import ModelRunner


class TpModelWorker(TpModelWorkerBase):
    """A tensor parallel model worker."""

    runner_class = ModelRunner

    def forward_batch_generation(self, model_worker_batch, launch_done=None, skip_sample: bool = False):
        forward_batch = ForwardBatch.init_new(model_worker_batch, self.model_runner)
        logits_output, can_run_cuda_graph = self.model_runner.forward(forward_batch)
        next_token_ids = self.model_runner.sample(logits_output, forward_batch)
        return logits_output, next_token_ids, can_run_cuda_graph
