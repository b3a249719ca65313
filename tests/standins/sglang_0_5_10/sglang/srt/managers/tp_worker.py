"""Stand-in for sglang/srt/managers/tp_worker.py of 0.5.10: forward_batch_generation returns a GenerationBatchResult.

0.5.11 has the same (its file is a link to this one).
"""

from sglang_common import GenerationBatchResult, TpModelWorkerBase

from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.model_runner import ModelRunner


class TpModelWorker(TpModelWorkerBase):
    """A tensor parallel model worker."""

    runner_class = ModelRunner

    def forward_batch_generation(self, model_worker_batch, forward_batch=None, is_verify: bool = False):
        forward_batch = ForwardBatch.init_new(model_worker_batch, self.model_runner)
        out = self.model_runner.forward(forward_batch)
        next_token_ids = self.model_runner.sample(out.logits_output, forward_batch)
        return GenerationBatchResult(out.logits_output, next_token_ids, out.can_run_graph)
