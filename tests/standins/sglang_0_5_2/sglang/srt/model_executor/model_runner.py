"""Stand-in for sglang/srt/model_executor/model_runner.py of 0.5.2: no msprobe, forward returns a tuple."""

from sglang_common import ModelRunnerBase

from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.server_args import ServerArgs


class ModelRunner(ModelRunnerBase):
    """ModelRunner runs the forward passes of the models."""

    def __init__(self, model_config, mem_fraction_static, gpu_id, tp_rank, tp_size, nccl_port, server_args: ServerArgs):
        super().__init__(gpu_id, server_args)
        self.dp_size = server_args.dp_size
        self.load_model()

    def forward(self, forward_batch: ForwardBatch, skip_attn_backend_init=False, pp_proxy_tensors=None):
        self.forward_pass_id += 1
        return self.forward_eager(forward_batch), False  # (logits, can_run_cuda_graph)
