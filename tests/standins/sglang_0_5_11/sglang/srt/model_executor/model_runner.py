"""Stand-in for sglang/srt/model_executor/model_runner.py of 0.5.11: native msprobe start/stop/step in forward."""

from dataclasses import dataclass

import torch
from tiny_lm import TinyLM, last_token_logits

from sglang.srt.model_executor.forward_batch_info import ForwardBatch
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
        tp_rank: int,
        tp_size: int,
        moe_ep_rank: int,
        moe_ep_size: int,
        pp_rank: int,
        pp_size: int,
        nccl_port: int,
        server_args: ServerArgs,
        dp_rank: int | None = None,
        attn_cp_rank: int | None = None,
        moe_dp_rank: int | None = None,
        is_draft_worker: bool = False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=None,
        memory_pool_config=None,
        draft_model_idx: int | None = None,
    ):
        self.device = server_args.device
        self.gpu_id = gpu_id
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.dp_size = server_args.dp_size if server_args.enable_dp_attention else 1
        self.server_args = server_args
        self.is_draft_worker = is_draft_worker
        self.forward_pass_id = 0
        self.msprobe_debugger = None
        if server_args.msprobe_dump_config is not None:
            self.init_msprobe()
        self.model = TinyLM()

    def init_msprobe(self):
        try:
            from msprobe.pytorch import PrecisionDebugger, seed_all
        except ImportError:
            return
        seed_all(mode=True)
        self.msprobe_debugger = PrecisionDebugger(config_path=self.server_args.msprobe_dump_config)

    def forward_decode(self, forward_batch: ForwardBatch, skip_attn_backend_init: bool = False, pp_proxy_tensors=None):
        return self.model(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def forward_extend(self, forward_batch: ForwardBatch, skip_attn_backend_init: bool = False, pp_proxy_tensors=None):
        return self.model(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def forward_idle(self, forward_batch: ForwardBatch, pp_proxy_tensors=None):
        return None

    def forward(
        self,
        forward_batch: ForwardBatch,
        skip_attn_backend_init: bool = False,
        pp_proxy_tensors=None,
        reinit_attn_backend: bool = False,
        split_forward_count: int = 1,
    ) -> ModelRunnerOutput:
        self.forward_pass_id += 1

        # Try msprob debugger
        if self.msprobe_debugger is not None:
            rank_id = self.gpu_id if self.dp_size is not None and self.dp_size > 1 else None
            self.msprobe_debugger.start(model=self.model, rank_id=rank_id)

        output = self._forward_raw(forward_batch, skip_attn_backend_init, pp_proxy_tensors)

        if self.msprobe_debugger is not None:
            self.msprobe_debugger.stop()
            self.msprobe_debugger.step()

        return output

    def _forward_raw(self, forward_batch: ForwardBatch, skip_attn_backend_init: bool, pp_proxy_tensors):
        if forward_batch.forward_mode.is_decode():
            ret = self.forward_decode(forward_batch, skip_attn_backend_init, pp_proxy_tensors)
        elif forward_batch.forward_mode.is_extend():
            ret = self.forward_extend(forward_batch, skip_attn_backend_init, pp_proxy_tensors)
        elif forward_batch.forward_mode.is_idle():
            ret = self.forward_idle(forward_batch, pp_proxy_tensors)
        else:
            raise ValueError(f"Invalid forward mode: {forward_batch.forward_mode}")
        return ModelRunnerOutput(logits_output=ret, can_run_graph=False)  # no CUDA graph on CPU

    def sample(self, logits_output: torch.Tensor, forward_batch: ForwardBatch):
        rows = forward_batch.extend_seq_lens_cpu or [1] * forward_batch.batch_size
        return last_token_logits(logits_output, rows).argmax(-1).tolist()
