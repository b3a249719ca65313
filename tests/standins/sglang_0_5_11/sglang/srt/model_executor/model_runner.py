"""Stand-in for sglang/srt/model_executor/model_runner.py of 0.5.11: SGLang's own msprobe start/stop/step in forward."""

from sglang_common import ModelRunnerOutput, NativeMsprobeModelRunnerBase, new_msprobe_debugger

from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.server_args import ServerArgs


class ModelRunner(NativeMsprobeModelRunnerBase):
    """ModelRunner runs the forward passes of the models."""

    def __init__(self, model_config, mem_fraction_static, gpu_id, tp_rank, tp_size, nccl_port, server_args: ServerArgs):
        super().__init__(gpu_id, server_args)
        self.dp_size = server_args.dp_size if server_args.enable_dp_attention else 1
        self.msprobe_debugger = None
        if server_args.msprobe_dump_config is not None:
            self.init_msprobe()
        self.load_model()

    def init_msprobe(self):
        self.msprobe_debugger = new_msprobe_debugger(self.server_args.msprobe_dump_config)

    def forward(self, forward_batch: ForwardBatch, skip_attn_backend_init=False, pp_proxy_tensors=None):
        self.forward_pass_id += 1
        logits = self.forward_under_msprobe(self.dp_size, lambda: self.forward_eager(forward_batch))
        return ModelRunnerOutput(logits, can_run_graph=False)
