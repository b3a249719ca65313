"""Stand-in for sglang/srt/model_executor/forward_batch_info.py of 0.5.2: the ForwardBatch has no request ids."""

from dataclasses import dataclass

from sglang_common import ForwardBatchBase, ForwardModeBase

ForwardMode = ForwardModeBase(
    "ForwardMode", "EXTEND DECODE MIXED IDLE TARGET_VERIFY DRAFT_EXTEND DUMMY_FIRST SPLIT_PREFILL", module=__name__
)


@dataclass
class ForwardBatch(ForwardBatchBase):
    """Store all inputs of a forward pass."""

    @classmethod
    def init_new(cls, batch, model_runner):
        return cls.from_batch(batch, batch.extend_prefix_lens, batch.extend_seq_lens)
