"""The log-prob gap of one sample computed the plain way, from verl's definitions, for the tests to compare with.

``old``, ``rollout`` and ``mask`` are one sample's response rows (old log-probs as the trainer cuts them
out of the engine's whole-sequence output, the rollout's, the response mask); the definitions are verl's
``calculate_debug_metrics`` (``verl/utils/debug/metrics.py``) restricted to the sample.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

# logprob_gap.jsonl's fields, in order (and, on the lines MSPROBE_HOOKS_GAP_TOKENS chooses, TOKEN_FIELDS after them).
GAP_FIELDS = [
    "source",
    "timestamp",
    "pid",
    "rank",
    "global_step",
    "micro_batch",
    "sample",
    "request_id",
    "uid",
    "session_id",
    "prompt_len",
    "prompt_hash",
    "tokens",
    "max",
    "mean",
    "argmax",
    "over",
    "threshold",
    "probs_diff_max",
    "probs_diff_mean",
    "temperature",
]
TOKEN_FIELDS = ["token_ids", "log_probs", "rollout_log_probs"]
APPROXIMATE = ("mean", "probs_diff_max", "probs_diff_mean")  # sums, and exp's last bit, depend on the order


def expected_gap(old: Sequence[float], rollout: Sequence[float], mask: Sequence[int], threshold: float) -> dict:
    old, rollout = torch.as_tensor(old, dtype=torch.float32), torch.as_tensor(rollout, dtype=torch.float32)
    counted = torch.as_tensor(mask).bool()
    if not counted.any():
        empty = dict.fromkeys(("max", "mean", "argmax", "probs_diff_max", "probs_diff_mean"))
        return {"tokens": 0, "over": 0, **empty}
    gap = (old - rollout).abs()[counted]
    probs = (old.exp() - rollout.exp()).abs()[counted]
    positions = torch.nonzero(counted).flatten()
    return {
        "tokens": int(counted.sum()),
        "max": float(gap.max()),
        "mean": float(gap.mean()),
        "argmax": int(positions[int(torch.argmax(gap))]),  # torch.argmax names the first of equal maxima
        "over": int((gap.double() > threshold).sum()),
        "probs_diff_max": float(probs.max()),
        "probs_diff_mean": float(probs.mean()),
    }


def assert_gap(got: dict, want: dict) -> None:
    """``got`` (a gap line, or a SampleGap's fields) holds ``want``: exact but for the sums and exp."""
    for key, value in want.items():
        if key in APPROXIMATE and value is not None:
            assert got[key] == pytest.approx(value, rel=1e-6), (key, got, want)
        else:
            assert got[key] == value, (key, got, want)
