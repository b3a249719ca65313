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
on the host), and one small tensor, seven numbers per sample, comes back.

:class:`GapLog` writes the result, ``logprob_gap.jsonl`` (one line per sample of every micro-batch of an
actor's log-prob pass), for :class:`~msprobe_hooks.training.actor_dump.ActorDumper`, which calls it from
the engine patches. Nothing here imports torch at import time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from msprobe_hooks import join_keys, patching, storage
from msprobe_hooks.jsonl import JsonlLog
from msprobe_hooks.training.micro_batch import SampleInfo, describe_samples, global_step_of, row_lengths, selected

if TYPE_CHECKING:
    from msprobe_hooks.config import Config

ROLLOUT_LOG_PROBS = "rollout_log_probs"  # verl's key, in both trainers
_MASK_KEYS = ("response_mask", "loss_mask")  # loss_mask: verl's alias of it (left_right_2_no_padding)


class SampleGap(NamedTuple):
    """One sample's gap; ``max``, ``mean``, ``argmax`` and the probs are None when no token is counted.

    ``log_probs`` and ``rollout_log_probs``: every response token's value (counted or not), rounded to
    :data:`~msprobe_hooks.join_keys.GAP_TOKEN_DECIMALS` decimals, when :func:`statistics` was asked to keep them;
    else None.
    """

    tokens: int
    max: float | None
    mean: float | None
    argmax: int | None
    over: int
    probs_diff_max: float | None
    probs_diff_mean: float | None
    log_probs: list[float] | None = None
    rollout_log_probs: list[float] | None = None


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


def statistics(
    log_probs: Any, micro_batch: Any, samples: list[SampleInfo], threshold: float, keep_values: bool = False
) -> list[SampleGap]:
    """The gap of every sample of ``micro_batch`` (``samples``, as :func:`describe_samples` reads them) from the
    engine's ``log_probs`` (jagged, the whole sequences, packed in the micro-batch's order).

    ``micro_batch`` is the engine's own, holding ``rollout_log_probs``. ``keep_values``: each gap also holds
    its response tokens' two log-probs (one more transfer back). Raises ValueError for a layout whose rows do
    not line up with the responses.
    """
    import torch

    values = log_probs.values() if log_probs.is_nested else log_probs.reshape(-1)
    if values.shape[0] != sum(s.seq_len for s in samples):
        raise ValueError(
            f"the log-probs hold {values.shape[0]} tokens, the micro-batch {sum(s.seq_len for s in samples)}"
        )
    response_lens = [s.response_len for s in samples]
    mask = next((micro_batch.get(key) for key in _MASK_KEYS if micro_batch.get(key, None) is not None), None)
    rollout = _rows(micro_batch[ROLLOUT_LOG_PROBS], response_lens, ROLLOUT_LOG_PROBS)
    counted = (
        torch.ones_like(rollout, dtype=torch.bool) if mask is None else _rows(mask, response_lens, "response_mask")
    )
    tokens = int(rollout.shape[0])

    # Response token k of the flat rows is token j = k - starts[i] of sample i, whose log-prob is entry
    # offset_i + prompt_len_i - 1 + j of the packed log-probs: k + shift[i].
    # Built on the log-probs' device: on the host, torch would wake its thread pool for these few numbers.
    device = values.device
    starts = [sum(response_lens[:i]) for i in range(len(samples))]
    shift = []
    for s, start in zip(samples, starts, strict=True):
        if s.offset is None:  # describe_samples gives every sample of a packed micro-batch its offset
            raise ValueError(f"sample {s.index} has no offset in the packed log-probs")
        shift.append(s.offset + s.prompt_len - 1 - start)
    lengths = torch.tensor(response_lens, device=device)
    sample = torch.repeat_interleave(torch.arange(len(samples), device=device), lengths, output_size=tokens)
    flat = torch.arange(tokens, device=device)
    entry = flat + torch.tensor(shift, device=device)[sample]
    counted = counted.to(device, non_blocking=True) != 0
    rollout = rollout.to(device, non_blocking=True).float()
    old = values[entry].float()
    gap = (old - rollout).abs()
    probs = (old.exp() - rollout.exp()).abs()  # verl: |exp(old_log_probs) - exp(rollout_log_probs)|

    rows = (2, len(samples))
    # Maxima of the counted tokens (both are >= 0: -1 stands for none) ...
    shown = torch.where(counted, torch.stack([gap, probs]), -1.0)
    top = torch.full(rows, -1.0, device=device).scatter_reduce(1, sample.expand(2, -1), shown, "amax")
    # ... the first token of each sample that reaches its maximum ...
    firsts = torch.where(counted & (shown[0] == top[0][sample]), flat, tokens)
    first = torch.full(rows[1:], tokens, device=device).scatter_reduce(0, sample, firsts, "amin")
    # ... and the counts and sums, in float64.
    weight = counted.double()
    parts = torch.stack([weight, gap.double() * weight, probs.double() * weight, weight * (gap.double() > threshold)])
    sums = torch.zeros((4, rows[1]), dtype=torch.float64, device=device).index_add_(1, sample, parts)
    table = torch.cat([sums, top.double(), first.double().unsqueeze(0)]).T.tolist()  # the one transfer back

    values_of: list[tuple[list[float] | None, list[float] | None]] = [(None, None)] * len(samples)
    if keep_values:
        pair = torch.stack([old, rollout]).double().round(decimals=join_keys.GAP_TOKEN_DECIMALS).tolist()
        ends = [start + length for start, length in zip(starts, response_lens, strict=True)]
        values_of = [(pair[0][a:b], pair[1][a:b]) for a, b in zip(starts, ends, strict=True)]

    gaps = []
    for row, start, values in zip(table, starts, values_of, strict=True):
        n, total, probs_total, over, gap_max, probs_max, k = row
        if not n:
            gaps.append(SampleGap(0, None, None, None, 0, None, None, *values))
            continue
        mean, probs_mean = total / n, probs_total / n
        gaps.append(SampleGap(int(n), gap_max, mean, int(k) - start, int(over), probs_max, probs_mean, *values))
    return gaps


def temperatures(micro_batch: Any, samples: list[SampleInfo]) -> list[float | None]:
    """The temperature the engine divided each sample's logits by: the micro-batch's ``temperature``, which
    verl's engines read in their forward (FSDP's ``prepare_model_inputs``, Megatron's ``forward_step``), a
    number or one per sample; None where the micro-batch has none."""
    from verl.utils import tensordict_utils as tu

    value = tu.get(micro_batch, "temperature", None)
    if value is None:
        return [None] * len(samples)
    tolist = getattr(value, "tolist", None)
    value = tolist() if callable(tolist) else value
    if isinstance(value, list):  # per sample
        return [float(value[s.index]) if len(value) > 1 else float(value[0]) for s in samples]
    return [float(value)] * len(samples)


def token_ids(micro_batch: Any, samples: list[SampleInfo]) -> list[list[int]]:
    """Each sample's input ids (prompt + response) as the micro-batch feeds them to the engine's forward."""
    ids = micro_batch["input_ids"]
    if ids.is_nested:
        flat, offsets = ids.values().tolist(), ids.offsets().tolist()
        return [flat[offsets[s.index] : offsets[s.index + 1]] for s in samples]
    rows = ids.tolist()  # dense: every row is a whole sequence (row_lengths)
    return [rows[s.index] for s in samples]


def with_tokens_of(cfg: Config, dumped: bool, sample: SampleInfo) -> bool:
    """Whether ``sample``'s gap line carries its tokens (``MSPROBE_HOOKS_GAP_TOKENS``): ``all``; ``dumped``, when
    its pass is dumped and ``DUMP_REQUEST_IDS`` (if set) names it; never with ``none``."""
    from msprobe_hooks.config import GAP_TOKENS_ALL, GAP_TOKENS_DUMPED

    if cfg.gap_tokens == GAP_TOKENS_ALL:
        return True
    return cfg.gap_tokens == GAP_TOKENS_DUMPED and dumped and selected(sample, cfg.dump_request_ids)


def output_log_probs(result: Any) -> Any:
    """``model_output["log_probs"]`` of an engine forward's result (``(loss, output)`` or Megatron's
    ``(loss, tokens, output)``), or None."""
    output = result[-1] if isinstance(result, tuple) and result else None
    model_output = output.get("model_output") if isinstance(output, dict) else None
    return model_output.get("log_probs") if isinstance(model_output, dict) else None


class GapLog:
    """This process's ``logprob_gap.jsonl``, opened under the training dump root at its first line.

    ``root(cfg)`` gives that root (the actor config's ``dump_path``, else the default), read only when
    a first line is due: the gap is logged whether or not anything is dumped.
    """

    def __init__(self, root: Callable[[Config], str]) -> None:
        self._root = root
        self._log: JsonlLog | None = None

    def write(self, cfg: Config, micro_batch_index: int, micro_batch: Any, result: Any, dumped: bool = False) -> None:
        """The lines of one micro-batch (``micro_batch_index`` in its pass) of an actor's log-prob pass: one per sample.

        ``result`` is what the engine's forward returned for it (FSDP's ``forward_step``, Megatron's
        ``postprocess_micro_batch_func``): its last item holds ``model_output["log_probs"]``. Nothing is
        written without the rollout's log-probs in the micro-batch (``rollout.calculate_log_probs=False``)
        or without log-probs in the output (a distillation-only pass). ``dumped``: the pass is one
        ``DUMP_PHASE`` dumps, whose samples' lines carry their tokens under ``MSPROBE_HOOKS_GAP_TOKENS=dumped``.
        """
        if not has_rollout_log_probs(micro_batch):
            return
        log_probs = output_log_probs(result)
        if log_probs is None:
            return
        import torch

        samples = describe_samples(micro_batch)
        with_tokens = [with_tokens_of(cfg, dumped, s) for s in samples]
        with torch.no_grad():
            gaps = statistics(log_probs, micro_batch, samples, cfg.gap_threshold, keep_values=any(with_tokens))
        temperature = temperatures(micro_batch, samples)
        ids = token_ids(micro_batch, samples) if any(with_tokens) else [None] * len(samples)
        global_step = global_step_of(micro_batch)
        if self._log is None:
            self._log = JsonlLog(self._root(cfg), join_keys.GAP_LOG)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else None
        for sample, gap, tokens, t, sample_ids in zip(samples, gaps, with_tokens, temperature, ids, strict=True):
            if sample.padding:  # verl's filler samples (upsample_batch_to_divisible_size): no rollout behind them
                continue
            record = {
                "source": join_keys.GAP_SOURCE,
                "timestamp": join_keys.timestamp(),
                "pid": os.getpid(),
                "rank": rank,
                "global_step": global_step,
                "micro_batch": micro_batch_index,
                "sample": sample.index,
                "request_id": sample.request_id,
                "uid": sample.uid,
                "session_id": sample.session_id,
                "prompt_len": sample.prompt_len,
                "prompt_hash": sample.prompt_hash,
                "tokens": gap.tokens,
                "max": gap.max,
                "mean": gap.mean,
                "argmax": gap.argmax,
                "over": gap.over,
                "threshold": cfg.gap_threshold,
                "probs_diff_max": gap.probs_diff_max,
                "probs_diff_mean": gap.probs_diff_mean,
                # ours, after the published fields
                "temperature": t,
            }
            if tokens:
                record.update(token_ids=sample_ids, log_probs=gap.log_probs, rollout_log_probs=gap.rollout_log_probs)
            try:
                self._log.write(record)
            except OSError as exc:  # a full or removed dump root: one line naming the cause
                what = f"the {join_keys.GAP_LOG} lines of micro-batch {micro_batch_index}"
                storage.report_loss(what, exc, self._log.path, patching.strict())
                return
