"""What the SGLang stand-ins of every version share: fields and behaviour no patch tells apart by version.

Each version's tree (``sglang_0_5_*/sglang/srt/...``) defines SGLang's classes under SGLang's names
and module paths, on these bases, adding what its release has: ``ModelWorkerBatch.reqs`` from
0.5.6, ``ForwardBatch.rids`` from 0.5.10, SGLang's own msprobe debugger in ``ModelRunner`` from
0.5.11, the ScheduleBatch handed to the worker itself from 0.5.13. A module of 0.5.11 that 0.5.11
did not change (where the stand-in looks) is a link to 0.5.10's.

So nothing here may carry a member that a supported release lacks. ``tests/inference/test_sglang_contract.py``
reads a stand-in module together with the classes it takes from here, as Python sees them: a field
moved here counts for every version, also where the check is that a release lacks it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from enum import IntEnum
from typing import Any

import torch
from tiny_lm import TinyLM, last_token_logits, positions_of

# --- sglang/srt/model_executor/forward_batch_info.py ----------------------------------------------


class ForwardModeBase(IntEnum):
    """ForwardMode's checks. A version lists its modes: ``ForwardModeBase("ForwardMode", "EXTEND DECODE ...")``."""

    def is_extend(self) -> bool:
        # Releases differ only in speculative and split modes, which no stand-in runs.
        return self.name in ("EXTEND", "MIXED", "TARGET_VERIFY", "DRAFT_EXTEND", "SPLIT_PREFILL")

    def is_decode(self) -> bool:
        return self.name == "DECODE"

    def is_idle(self) -> bool:
        return self.name == "IDLE"


@dataclasses.dataclass
class ForwardBatchBase:
    """The ForwardBatch fields of every version that the stand-ins and the patches read."""

    forward_mode: ForwardModeBase
    batch_size: int
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    # extend-mode-only fields are None on decode/idle
    extend_prefix_lens_cpu: list[int] | None = None
    extend_seq_lens_cpu: list[int] | None = None

    @classmethod
    def from_batch(cls, batch: Any, prefix_lens: list[int] | None, extend_lens: list[int] | None, **fields: Any):
        """What ``init_new`` does on every version, given where that version's batch keeps the extend lengths."""
        ret = cls(
            forward_mode=batch.forward_mode,
            batch_size=len(batch.seq_lens),
            input_ids=batch.input_ids,
            seq_lens=batch.seq_lens,
            seq_lens_cpu=batch.seq_lens_cpu,
            **fields,
        )
        if not ret.forward_mode.is_decode() and not ret.forward_mode.is_idle():
            ret.extend_prefix_lens_cpu = list(prefix_lens)
            ret.extend_seq_lens_cpu = list(extend_lens)
        ret.positions = positions_of(ret.extend_prefix_lens_cpu, ret.extend_seq_lens_cpu, ret.seq_lens_cpu.tolist())
        return ret


# --- sglang/srt/managers/schedule_batch.py --------------------------------------------------------


class ReqBase:
    """The input and output status of a request."""

    def __init__(self, rid: str, origin_input_ids: Any) -> None:
        self.rid = rid
        self.origin_input_ids = origin_input_ids
        self.output_ids: list[int] = []
        self.prefix_indices: list[int] = []


@dataclasses.dataclass
class ScheduleBatchBase:
    """The ScheduleBatch fields of every version: the scheduler's view of one forward."""

    reqs: list[ReqBase]
    forward_mode: ForwardModeBase | None = None
    input_ids: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    prefix_lens: list[int] | None = None
    extend_lens: list[int] | None = None


_bid = 0  # the worker batch's id, counted per process as SGLang's module-level ``bid``


@dataclasses.dataclass
class WorkerBatchBase:
    """The ModelWorkerBatch fields of 0.5.2-0.5.12: what the scheduler hands the model worker."""

    bid: int
    forward_mode: ForwardModeBase
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor | None
    extend_seq_lens: list[int] | None
    extend_prefix_lens: list[int] | None

    @classmethod
    def of(cls, batch: ScheduleBatchBase, seq_lens_cpu_cache: torch.Tensor | None, **fields: Any):
        """What ``ScheduleBatch.get_model_worker_batch`` does on 0.5.2-0.5.12."""
        global _bid
        _bid += 1
        extend = not batch.forward_mode.is_decode() and not batch.forward_mode.is_idle()
        return cls(
            bid=_bid,
            forward_mode=batch.forward_mode,
            input_ids=batch.input_ids,
            seq_lens=batch.seq_lens,
            seq_lens_cpu=seq_lens_cpu_cache if seq_lens_cpu_cache is not None else batch.seq_lens.cpu(),
            extend_seq_lens=batch.extend_lens if extend else None,
            extend_prefix_lens=batch.prefix_lens if extend else None,
            **fields,
        )


# --- sglang/srt/model_executor/model_runner.py ----------------------------------------------------


@dataclasses.dataclass
class ModelRunnerOutput:
    """What ``ModelRunner.forward`` returns from 0.5.4 (before, a tuple)."""

    logits_output: torch.Tensor | None
    can_run_graph: bool


class ModelRunnerBase:
    """What every version's ModelRunner does on CPU: hold TinyLM, run it eagerly, sample greedily.

    A version's ``__init__`` keeps the parameters its worker passes, in the release's order (tp_rank
    and tp_size up to 0.5.12, runtime_context after); the rest (MoE and pipeline ranks, memory
    pools, draft-model settings) are left out.
    """

    def __init__(self, gpu_id: int, server_args: Any) -> None:
        self.device = server_args.device
        self.gpu_id = gpu_id
        self.server_args = server_args
        self.forward_pass_id = 0

    def load_model(self) -> None:
        self.model = TinyLM()

    def forward_eager(self, forward_batch: Any) -> torch.Tensor | None:
        """The model on the batch's tokens (no CUDA graph on CPU); nothing for an idle batch."""
        mode = forward_batch.forward_mode
        if mode.is_idle():
            return None
        if not mode.is_decode() and not mode.is_extend():
            raise ValueError(f"Invalid forward mode: {mode}")
        return self.model(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def sample(self, logits_output: torch.Tensor, forward_batch: Any) -> list[int]:
        rows = forward_batch.extend_seq_lens_cpu or [1] * forward_batch.batch_size
        return last_token_logits(logits_output, rows).argmax(-1).tolist()


class NativeMsprobeModelRunnerBase(ModelRunnerBase):
    """ModelRunnerBase with SGLang's own msprobe switch (``--msprobe-dump-config``, 0.5.11+) around forwards.

    Each version makes ``self.msprobe_debugger`` (:func:`new_msprobe_debugger`) in its own way.
    """

    def forward_under_msprobe(self, dp_size: int | None, forward: Callable[[], Any]) -> Any:
        if self.msprobe_debugger is not None:
            rank_id = self.gpu_id if dp_size is not None and dp_size > 1 else None
            self.msprobe_debugger.start(model=self.model, rank_id=rank_id)

        output = forward()

        if self.msprobe_debugger is not None:
            self.msprobe_debugger.stop()
            self.msprobe_debugger.step()

        return output


def new_msprobe_debugger(config_path: str) -> Any | None:
    """The debugger SGLang 0.5.11+ makes for ``--msprobe-dump-config``; None without msprobe installed."""
    try:
        from msprobe.pytorch import PrecisionDebugger, seed_all
    except ImportError:
        return None
    seed_all(mode=True)
    return PrecisionDebugger(config_path=config_path)


# --- sglang/srt/managers/tp_worker.py -------------------------------------------------------------


@dataclasses.dataclass
class GenerationBatchResult:
    """What ``TpModelWorker.forward_batch_generation`` returns from 0.5.4 (before, a tuple)."""

    logits_output: torch.Tensor | None
    next_token_ids: list[int]
    can_run_cuda_graph: bool


class TpModelWorkerBase:
    """How TpModelWorker makes its ModelRunner on 0.5.2-0.5.12: with the parallel ranks as arguments."""

    runner_class: type  # the version's ModelRunner

    def __init__(self, server_args: Any, gpu_id: int, tp_rank: int) -> None:
        self.model_runner = self.runner_class(
            None, 0.8, gpu_id, tp_rank, server_args.tp_size, nccl_port=0, server_args=server_args
        )


# --- sglang/srt/server_args.py --------------------------------------------------------------------


@dataclasses.dataclass
class ServerArgsBase:
    """The ServerArgs fields of every version that the stand-ins read (each version adds its graph switches)."""

    model_path: str = "tiny"
    device: str = "cpu"
    tp_size: int = 1
    dp_size: int = 1
    enable_dp_attention: bool = False
    disable_overlap_schedule: bool = False
    disable_radix_cache: bool = False
    enable_mixed_chunk: bool = False
