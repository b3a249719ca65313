"""Stand-in for sglang/srt/model_executor/model_runner.py of 0.5.23: msprobe via misc_utils, no forward_extend."""

from dataclasses import dataclass

import torch
from tiny_lm import TinyLM, last_token_logits

from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.model_runner_components import misc_utils
from sglang.srt.runtime_context import get_parallel
from sglang.srt.server_args import ServerArgs


@dataclass
class ModelRunnerOutput:
    logits_output: torch.Tensor
    can_run_graph: bool


class ModelRunner:
    """ModelRunner runs the forward passes of the models."""

    def __init__(
        self,
        model_config,
        mem_fraction_static: float,
        gpu_id: int,
        nccl_port: int,
        server_args: ServerArgs,
        is_draft_worker: bool = False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=None,
        memory_pool_config=None,
        draft_model_idx: int | None = None,
        draft_attention_backend: str | None = None,
    ):
        self.device = server_args.device
        self.gpu_id = gpu_id
        self.server_args = server_args
        self.is_draft_worker = is_draft_worker
        self.forward_pass_id = 0
        self.init_msprobe()
        self.model = TinyLM()

    def init_msprobe(self):
        self.msprobe_debugger = misc_utils.create_msprobe_debugger()

    def forward(
        self,
        forward_batch: ForwardBatch,
        skip_attn_backend_init: bool | None = None,  # deprecated
        pp_proxy_tensors=None,
        reinit_attn_backend: bool = False,
        split_forward_count: int = 1,
    ) -> ModelRunnerOutput:
        self.forward_pass_id += 1

        # Try msprob debugger
        if self.msprobe_debugger is not None:
            rank_id = self.gpu_id if get_parallel().dp_size > 1 else None
            self.msprobe_debugger.start(model=self.model, rank_id=rank_id)

        output = self._forward_raw(forward_batch, pp_proxy_tensors, reinit_attn_backend, split_forward_count)

        if self.msprobe_debugger is not None:
            self.msprobe_debugger.stop()
            self.msprobe_debugger.step()

        return output

    def _forward_raw(
        self, forward_batch: ForwardBatch, pp_proxy_tensors, reinit_attn_backend=False, split_forward_count=1
    ):
        if forward_batch.forward_mode.is_idle():
            return ModelRunnerOutput(logits_output=None, can_run_graph=False)
        logits = self.model(forward_batch.input_ids, forward_batch.positions, forward_batch)  # the eager runner
        return ModelRunnerOutput(logits_output=logits, can_run_graph=False)

    def sample(self, logits_output: torch.Tensor, forward_batch: ForwardBatch):
        rows = forward_batch.extend_seq_lens_cpu or [1] * forward_batch.batch_size
        return last_token_logits(logits_output, rows).argmax(-1).tolist()
