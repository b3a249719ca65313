"""Stand-in for sglang/srt/model_executor/forward_batch_info.py of 0.5.10: ForwardBatch.rids is new.

0.5.11 has the same (its file is a link to this one).
"""

from dataclasses import dataclass

from sglang_common import ForwardBatchBase, ForwardModeBase

ForwardMode = ForwardModeBase(
    "ForwardMode", "EXTEND DECODE MIXED IDLE TARGET_VERIFY DRAFT_EXTEND DUMMY_FIRST SPLIT_PREFILL", module=__name__
)


@dataclass
class ForwardBatch(ForwardBatchBase):
    """Store all inputs of a forward pass."""

    rids: list[str] | None = None

    @classmethod
    def init_new(cls, batch, model_runner):
        rids = [req.rid for req in batch.reqs]
        return cls.from_batch(batch, batch.extend_prefix_lens, batch.extend_seq_lens, rids=rids)
