"""Stand-in for sglang/srt/model_executor/forward_batch_info.py of 0.5.23: init_new takes the ScheduleBatch."""

from dataclasses import dataclass

from sglang_common import ForwardBatchBase, ForwardModeBase

ForwardMode = ForwardModeBase(
    "ForwardMode",
    "EXTEND DECODE MIXED IDLE TARGET_VERIFY DRAFT_EXTEND_V2 PREBUILT SPLIT_PREFILL DLLM_EXTEND",
    module=__name__,
)


@dataclass
class ForwardBatch(ForwardBatchBase):
    """Store all inputs of a forward pass."""

    rids: list[str] | None = None

    @classmethod
    def init_new(cls, batch, model_runner, *, capture_hidden_mode=None, return_hidden_states_before_norm=False):
        return cls.from_batch(batch, batch.prefix_lens, batch.extend_lens, rids=[req.rid for req in batch.reqs])
