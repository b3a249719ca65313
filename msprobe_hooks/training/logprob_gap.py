"""The log-prob gap of each sample: ``|old_log_prob - rollout_log_prob|`` on its response tokens.

What an RL engineer sees first is verl's ``training/rollout_probs_diff_*`` (or another framework's
``train_rollout_logprob_abs_diff``): the gap between the log-probs the actor recomputes in its
log-prob pass and those the rollout engine returned. :func:`statistics` gives it per sample, from the
tensors that pass already holds, in verl's own definitions (``verl/utils/debug/metrics.py``):

* the tokens are the response tokens whose ``response_mask`` is set (tool tokens of a multi-turn
  trajectory are not);
* ``max``/``mean``/``argmax``/``over`` are of ``|old - rollout|`` on log-probs, the gap other frameworks log;
* ``probs_diff_max``/``probs_diff_mean`` are of ``|exp(old) - exp(rollout)|``, verl's
  ``rollout_probs_diff_max/mean`` (taken there over the whole batch's tokens: its max is the max of these,
  its mean their token-weighted mean).

Where the tokens are. The engine's log-probs cover the whole sequence (entry ``t`` is the log-prob of
token ``t + 1``): response token ``j`` of a sample of ``S`` tokens with ``R`` response tokens is entry
``S - R - 1 + j`` (``P - 1 + j``, ``P`` the prompt length), as verl's ``response_from_nested`` and
``no_padding_2_padding`` read it. ``R = S - P`` in both trainer layouts of verl 0.9.1:

* v1 (TransferQueue): ``rollout_log_probs`` and ``response_mask`` are jagged, one row of ``R`` per
  sample (``AgentLoopOutput.as_dict``); dense when every response happens to have the same length
  (``list_of_dict_to_tensordict`` stacks them), ``R`` the width then;
* v0 (DataProto, ``left_right_2_no_padding``): both stay dense and right-padded to the batch's
  response width (``rollout_log_probs`` padded with zeros, ``response_mask`` with zeros), and ``P``/``R``
  come from the kept ``attention_mask`` (:func:`~msprobe_hooks.training.micro_batch.prompt_lengths`).

The work runs on the log-probs' device: the rollout's rows go there (they arrive with the micro-batch,
on the host), and one small tensor, seven numbers per sample, comes back. Nothing here imports torch at
import time.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from msprobe_hooks.training.micro_batch import prompt_lengths, row_lengths

ROLLOUT_LOG_PROBS = "rollout_log_probs"  # verl's key, in both trainers
_MASK_KEYS = ("response_mask", "loss_mask")  # loss_mask: verl's alias of it (left_right_2_no_padding)


class SampleGap(NamedTuple):
    """One sample's gap; ``max``, ``mean``, ``argmax`` and the probs are None when no token is counted."""

    tokens: int
    max: float | None
    mean: float | None
    argmax: int | None
    over: int
    probs_diff_max: float | None
    probs_diff_mean: float | None


def has_rollout_log_probs(micro_batch: Any) -> bool:
    return micro_batch.get(ROLLOUT_LOG_PROBS, None) is not None


def _rows(tensor: Any, lengths: list[int], what: str) -> Any:
    """The first ``lengths[i]`` entries of row ``i``, concatenated: jagged rows must be exactly that long,
    dense ones at least (the rest is padding)."""
    import torch

    if tensor.is_nested:
        found = row_lengths(tensor)
        if found != lengths:
            raise ValueError(f"{what} has rows of {found} tokens, the responses {lengths}")
        return tensor.values()
    if tensor.dim() != 2 or tensor.shape[0] != len(lengths) or tensor.shape[1] < max(lengths, default=0):
        raise ValueError(f"{what} is dense {tuple(tensor.shape)}, shorter than the responses {lengths}")
    if len(set(lengths)) == 1:
        return tensor[:, : lengths[0]].reshape(-1)
    return torch.cat([row[:length] for row, length in zip(tensor, lengths, strict=True)])


def statistics(log_probs: Any, micro_batch: Any, threshold: float) -> list[SampleGap]:
    """The gap of every sample of ``micro_batch`` from the engine's ``log_probs`` (jagged, the whole sequence).

    ``micro_batch`` is the engine's own, holding ``rollout_log_probs``. Raises ValueError for a layout
    whose rows do not line up with the responses.
    """
    import torch

    values = log_probs.values() if log_probs.is_nested else log_probs.reshape(-1)
    sequence_lens = row_lengths(micro_batch["input_ids"])
    response_lens = [s - p for s, p in zip(sequence_lens, prompt_lengths(micro_batch), strict=True)]
    if values.shape[0] != sum(sequence_lens):
        raise ValueError(f"the log-probs hold {values.shape[0]} tokens, the micro-batch {sum(sequence_lens)}")
    mask = next((micro_batch.get(key) for key in _MASK_KEYS if micro_batch.get(key, None) is not None), None)
    rollout = _rows(micro_batch[ROLLOUT_LOG_PROBS], response_lens, ROLLOUT_LOG_PROBS)
    if mask is None:
        counted = torch.ones_like(rollout, dtype=torch.bool)
    else:
        counted = _rows(mask, response_lens, "response_mask") != 0

    # Per response token: its sample, its index j in the response, its entry in the packed log-probs.
    count = len(response_lens)
    lengths = torch.tensor(response_lens, dtype=torch.long)
    sample = torch.repeat_interleave(torch.arange(count), lengths, output_size=int(rollout.shape[0]))
    starts = torch.cumsum(lengths, 0) - lengths
    index = torch.arange(int(rollout.shape[0])) - starts[sample]
    ends = torch.cumsum(torch.tensor(sequence_lens, dtype=torch.long), 0)
    entry = (ends - lengths - 1)[sample] + index

    device = values.device
    sample, index, entry = (t.to(device, non_blocking=True) for t in (sample, index, entry))
    rollout, counted = rollout.to(device, non_blocking=True), counted.to(device, non_blocking=True)
    old = values[entry].float()
    rollout = rollout.float()
    gap = (old - rollout).abs()
    probs = (old.exp() - rollout.exp()).abs()  # verl: |exp(old_log_probs) - exp(rollout_log_probs)|

    def per_sample(reduce: str, source: Any, empty: float) -> Any:
        out = torch.full((count,), empty, dtype=source.dtype, device=device)
        return out.scatter_reduce(0, sample, source, reduce, include_self=True)

    weight = counted.to(torch.float64)
    shown_gap = torch.where(counted, gap, -1.0)  # gaps are >= 0: -1 never wins a max
    gap_max = per_sample("amax", shown_gap, -1.0)
    first_max = torch.where(counted & (shown_gap == gap_max[sample]), index, torch.iinfo(torch.long).max)
    table = torch.stack(
        [
            per_sample("sum", weight, 0.0),
            gap_max.double(),
            per_sample("sum", gap.double() * weight, 0.0),
            per_sample("amin", first_max, torch.iinfo(torch.long).max).double(),
            per_sample("sum", (counted & (gap.double() > threshold)).to(torch.float64), 0.0),
            per_sample("amax", torch.where(counted, probs, -1.0), -1.0).double(),
            per_sample("sum", probs.double() * weight, 0.0),
        ],
        dim=1,
    )
    gaps = []
    for tokens, top, total, argmax, over, probs_top, probs_total in table.tolist():  # the one transfer back
        if not tokens:
            gaps.append(SampleGap(0, None, None, None, 0, None, None))
            continue
        gaps.append(
            SampleGap(int(tokens), top, total / tokens, int(argmax), int(over), probs_top, probs_total / tokens)
        )
    return gaps
