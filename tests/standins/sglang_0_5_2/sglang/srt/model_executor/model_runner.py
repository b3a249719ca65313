"""Stand-in for sglang/srt/model_executor/model_runner.py of 0.5.2: no msprobe, forward returns a tuple."""

import torch
from tiny_lm import TinyLM, last_token_logits

from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.server_args import ServerArgs


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
        is_draft_worker: bool = False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=None,
    ):
        self.device = server_args.device
        self.gpu_id = gpu_id
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.dp_size = server_args.dp_size
        self.server_args = server_args
        self.is_draft_worker = is_draft_worker
        self.forward_pass_id = 0
        self.model = TinyLM()

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
    ) -> tuple[torch.Tensor, bool]:
        self.forward_pass_id += 1
        return self._forward_raw(forward_batch, skip_attn_backend_init, pp_proxy_tensors)

    def _forward_raw(self, forward_batch: ForwardBatch, skip_attn_backend_init: bool, pp_proxy_tensors):
        if forward_batch.forward_mode.is_decode():
            ret = self.forward_decode(forward_batch, skip_attn_backend_init, pp_proxy_tensors)
        elif forward_batch.forward_mode.is_extend():
            ret = self.forward_extend(forward_batch, skip_attn_backend_init, pp_proxy_tensors)
        elif forward_batch.forward_mode.is_idle():
            ret = self.forward_idle(forward_batch, pp_proxy_tensors)
        else:
            raise ValueError(f"Invalid forward mode: {forward_batch.forward_mode}")
        return ret, False  # no CUDA graph on CPU

    def sample(self, logits_output: torch.Tensor, forward_batch: ForwardBatch):
        rows = forward_batch.extend_seq_lens_cpu or [1] * forward_batch.batch_size
        return last_token_logits(logits_output, rows).argmax(-1).tolist()
