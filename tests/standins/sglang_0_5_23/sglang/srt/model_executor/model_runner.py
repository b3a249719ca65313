"""Stand-in for sglang/srt/model_executor/model_runner.py of 0.5.23: runtime_context ranks, misc_utils msprobe."""

from sglang_common import ModelRunnerOutput, NativeMsprobeModelRunnerBase

from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.model_runner_components import misc_utils
from sglang.srt.runtime_context import get_parallel
from sglang.srt.server_args import ServerArgs


class ModelRunner(NativeMsprobeModelRunnerBase):
    """ModelRunner runs the forward passes of the models."""

    def __init__(self, model_config, mem_fraction_static, gpu_id, nccl_port, server_args: ServerArgs):
        super().__init__(gpu_id, server_args)
        self.init_msprobe()
        self.load_model()

    def init_msprobe(self):
        self.msprobe_debugger = misc_utils.create_msprobe_debugger()

    def forward(self, forward_batch: ForwardBatch, skip_attn_backend_init=None, pp_proxy_tensors=None):
        self.forward_pass_id += 1
        logits = self.forward_under_msprobe(get_parallel().dp_size, lambda: self.forward_eager(forward_batch))
        return ModelRunnerOutput(logits, can_run_graph=False)
