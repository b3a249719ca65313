"""A verl micro-batch as the engines get it: its samples (prompt, ids, keys), the TensorDict layouts of
both trainers, and a sample alone, cut to its prompt or whole (the extra forwards' inputs).

verl's v1 trainer (TransferQueue) hands the engine jagged tensors with per-sample fields; the v0
trainer (DataProto) dense, left-padded prompts with an attention mask. Nothing here imports torch or
verl at import time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from msprobe_hooks import join_keys
from msprobe_hooks.training.request_ids import ALL_REQUEST_IDS, REQUEST_ID

if TYPE_CHECKING:
    from torch.nested._internal.nested_tensor import NestedTensor

PADDING_UID_PREFIX = "pad"  # verl's trainer/ppo/padding_utils.py names its filler samples "pad<hex>"


@dataclass(frozen=True)
class SampleInfo:
    """What the log says about one sample of a micro-batch (the join keys of ``align``)."""

    index: int
    uid: str | None
    session_id: Any
    request_id: str | None  # the rollout request whose prefill is this prompt alone (the first turn)
    request_ids: list[str]  # every request of the trajectory, one per turn (or resumed segment)
    prompt_len: int
    prompt_hash: str
    seq_len: int
    response_len: int  # seq_len - prompt_len: verl's own rule (response_from_nested, no_padding_2_padding)
    # The sample's first token in the micro-batch's packed input (the previous samples' seq_len, in the
    # micro-batch's order, which is the order verl packs them in); a window holding the sample alone
    # sets 0, one whose input is not packed (padded rows, sliced sequences) None.
    offset: int | None

    @property
    def padding(self) -> bool:
        return isinstance(self.uid, str) and self.uid.startswith(PADDING_UID_PREFIX)

    def as_record(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uid": self.uid,
            "session_id": self.session_id,
            "request_id": self.request_id,
            "request_ids": self.request_ids,
            "prompt_len": self.prompt_len,
            "prompt_hash": self.prompt_hash,
            "seq_len": self.seq_len,
            "offset": self.offset,
            "response_len": self.response_len,
        }


def _plain(value: Any) -> Any:
    """JSON-friendly scalars from tensors and numpy values."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0:
        return item()
    return value


def _first(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return _first(value[0]) if value else None
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return _first(tolist())
    return _plain(value)


def _per_sample(value: Any, count: int) -> list[Any]:
    """A per-sample field as a list of ``count`` plain values (None when absent)."""
    if value is None:
        return [None] * count
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        value = tolist()
    if isinstance(value, (list, tuple)) and len(value) == count:
        return [_plain(v) for v in value]
    return [_plain(value)] * count


def _request_ids(value: Any) -> list[str]:
    """One sample's request id(s) as a list: one id per turn in multi-turn rollouts."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value if v is not None]
    return [str(value)]


def row_lengths(tensor: Any) -> list[int]:
    """Per-sample lengths of a jagged tensor, or the width of every row of a dense one."""
    if tensor.is_nested:
        return [int(n) for n in tensor.offsets().diff().tolist()]
    return [int(tensor.shape[-1])] * int(tensor.shape[0])


def prompt_lengths(micro_batch: Any) -> list[int]:
    """Prompt length of each sample, for both trainer layouts.

    v1 (TransferQueue): ``prompts`` is jagged, or dense when every prompt happens to have the same
    length. v0 (DataProto): ``prompts`` is dense and left-padded, ``attention_mask`` is kept.
    Otherwise: sequence length minus response length.
    """
    prompts = micro_batch.get("prompts", None)
    if prompts is not None:
        if prompts.is_nested:
            return row_lengths(prompts)
        mask = micro_batch.get("attention_mask", None)
        if mask is not None and not mask.is_nested:
            return [int(n) for n in mask[:, : prompts.shape[-1]].sum(-1).tolist()]
        return row_lengths(prompts)
    responses = micro_batch.get("response_mask", micro_batch.get("responses", None))
    if responses is None:
        raise ValueError("the micro-batch has neither 'prompts' nor 'responses'/'response_mask'")
    return [s - r for s, r in zip(row_lengths(micro_batch["input_ids"]), row_lengths(responses), strict=True)]


def is_trimmed(micro_batch: Any) -> bool:
    """Whether the trainer already cut the responses off (``PROMPTS_ONLY=trim``): every response is empty."""
    responses = micro_batch.get("responses", None)
    if responses is None:
        return False
    if responses.is_nested:
        return all(n == 0 for n in row_lengths(responses))
    return responses.shape[-1] == 0


def _sample_field(micro_batch: Any, key: str, count: int) -> list[Any]:
    """A per-sample field, from the top level or else from the sample's ``extra_fields`` dict.

    verl's v1 (TransferQueue) records keep ``extra_fields`` as one dict per sample, where the
    published recipe stamps ``request_id``; the top-level copy exists only where our promotion ran
    (not with a custom agent loop, nor where that patch stepped aside).
    """
    from verl.utils import tensordict_utils as tu

    values = _per_sample(tu.get(micro_batch, key), count)
    if all(value is not None for value in values):
        return values
    extras = _per_sample(tu.get(micro_batch, "extra_fields"), count)
    return [
        extra.get(key) if value is None and isinstance(extra, dict) else value
        for value, extra in zip(values, extras, strict=True)
    ]


def describe_samples(micro_batch: Any) -> list[SampleInfo]:
    """One :class:`SampleInfo` per sample of a verl micro-batch (jagged ``input_ids``)."""
    from verl.utils import tensordict_utils as tu

    input_ids = micro_batch["input_ids"]
    if input_ids.is_nested:  # slices of its values: unbind() costs ten times more, in every micro-batch
        values, bounds = input_ids.values(), input_ids.offsets().tolist()
        sequences = [values[start:end] for start, end in zip(bounds[:-1], bounds[1:], strict=True)]
    else:
        sequences = input_ids.unbind()
    count = len(sequences)
    lengths = prompt_lengths(micro_batch)
    uids = _per_sample(tu.get(micro_batch, "uid"), count)
    sessions = _per_sample(tu.get(micro_batch, "session_id"), count)
    firsts = _sample_field(micro_batch, REQUEST_ID, count)
    every = _sample_field(micro_batch, ALL_REQUEST_IDS, count)
    seq_lens = [int(sequence.shape[-1]) for sequence in sequences]
    offsets = [sum(seq_lens[:i]) for i in range(count)]
    return [
        SampleInfo(
            index=i,
            uid=None if uids[i] is None else str(uids[i]),
            session_id=sessions[i],
            request_id=None if firsts[i] is None else str(firsts[i]),
            request_ids=_request_ids(every[i] if every[i] is not None else firsts[i]),
            prompt_len=lengths[i],
            prompt_hash=join_keys.tensor_prompt_hash(sequences[i][: lengths[i]]),
            seq_len=seq_lens[i],
            response_len=seq_lens[i] - lengths[i],
            offset=offsets[i],
        )
        for i in range(count)
    ]


# The trainer's global step as the v0 trainer's patch stamps it on the log-prob pass's batch (``trainer_step_on``).
TRAINER_STEP = "msprobe_hooks_global_step"


@contextmanager
def trainer_step_on(batch: Any, step: Any) -> Iterator[None]:
    """``step`` on a DataProto's ``meta_info`` for the length of the block, then taken off again.

    verl's legacy trainer stamps no global step on the batch before its log-prob pass: the batch's per-sample
    ``global_steps`` there is the rollout's (the version of the weights that generated it, the step before). Its own
    key: ``meta_info["global_steps"]`` would clash with that per-sample field in ``DataProto.to_tensordict``.
    """
    meta = getattr(batch, "meta_info", None)
    if step is None or not isinstance(meta, dict):
        yield
        return
    meta[TRAINER_STEP] = step
    try:
        yield
    finally:
        meta.pop(TRAINER_STEP, None)


def global_step_of(micro_batch: Any) -> Any:
    """The trainer's global step: stamped by the v0 trainer's patch, else verl's ``global_steps`` (NonTensorData in
    v0, a per-sample field in v1)."""
    from verl.utils import tensordict_utils as tu

    stamped = tu.get(micro_batch, TRAINER_STEP)
    return _first(stamped if stamped is not None else tu.get(micro_batch, "global_steps"))


def _one_row(piece: Any, like: Any) -> Any:
    """A jagged tensor holding one row, ragged along its last dimension as ``like`` is."""
    import torch
    from verl.utils import tensordict_utils as tu

    build = getattr(tu, "nested_tensor_from_tensor_list", None)  # verl >= 0.8
    if build is not None:
        return build([piece], ragged_idx=getattr(like, "_ragged_idx", piece.dim()))
    nested = torch.nested.as_nested_tensor([piece], layout=torch.jagged)
    if piece.dim() > 1:  # as verl 0.7 marks 3-D position ids (maybe_fix_3d_position_ids)
        # as_nested_tensor is typed as returning a Tensor; with the jagged layout it is a NestedTensor
        cast("NestedTensor", nested)._ragged_idx = piece.dim()
    return nested


def prompt_only_micro_batch(micro_batch: Any, index: int, prompt_len: int) -> Any:
    """Sample ``index`` of ``micro_batch`` as a one-sample micro-batch holding only its prompt.

    Every per-sample field comes along (temperature, multi-modal inputs, flags); ``input_ids``
    and ``position_ids`` are cut to the prompt (the last dimension, so 3-D mRoPE ids too).
    ``loss_mask`` becomes zeros over the prompt: no token of it is a training target, and it is
    as long as ``input_ids``, which every reader accepts (Megatron's MTP loss-mask builders; the
    FSDP engine's padded path in verl 0.7.1/0.8, which takes its attention mask from it). The
    flags asking for extra outputs are turned off, and Megatron's padding to the mini-batch's
    longest sequence (``forced_max_seqlen``, verl 0.9) is dropped: only the prompt's own forward
    is wanted.
    """
    return _one_sample(micro_batch, index, prompt_len)


def sequence_micro_batch(micro_batch: Any, index: int, seq_len: int) -> Any:
    """Sample ``index`` of ``micro_batch`` alone, over its whole sequence (``DUMP_SEQUENCES=1``): as
    :func:`prompt_only_micro_batch`, with nothing cut (``seq_len`` is the sample's own length)."""
    return _one_sample(micro_batch, index, seq_len)


def _one_sample(micro_batch: Any, index: int, length: int) -> Any:
    """Sample ``index`` as a one-sample micro-batch over its first ``length`` tokens (see
    :func:`prompt_only_micro_batch`)."""
    import torch
    from verl.utils import tensordict_utils as tu

    one = tu.index_select_tensor_dict(micro_batch, [index])
    for key in ("input_ids", "position_ids"):
        full = micro_batch[key]
        one[key] = _one_row(full.unbind()[index][..., :length], full)
    loss_mask = micro_batch.get("loss_mask", None)
    if loss_mask is not None:
        zeros = torch.zeros(length, dtype=loss_mask.dtype, device=loss_mask.device)
        one["loss_mask"] = _one_row(zeros, micro_batch["input_ids"])
    tu.assign_non_tensor(
        one, calculate_entropy=False, calculate_sum_pi_squared=False, distillation_use_topk=False, compute_loss=False
    )
    if tu.get(one, "forced_max_seqlen") is not None:
        tu.assign_non_tensor(one, forced_max_seqlen=None)
    return one


def samples_and_step(micro_batch: Any) -> tuple[list[SampleInfo], Any]:
    return describe_samples(micro_batch), global_step_of(micro_batch)


def prompt_only_batches(micro_batch: Any, samples: list[SampleInfo]) -> list[Any]:
    return [prompt_only_micro_batch(micro_batch, sample.index, sample.prompt_len) for sample in samples]


def sequence_batches(micro_batch: Any, samples: list[SampleInfo]) -> list[Any]:
    return [sequence_micro_batch(micro_batch, sample.index, sample.seq_len) for sample in samples]


def selected(sample: SampleInfo, wanted: frozenset[str]) -> bool:
    """Whether ``DUMP_REQUEST_IDS`` (``wanted``, as the user wrote them) names one of the sample's requests.

    Any of its requests (every turn's) counts; vLLM's ``-xxxxxxxx`` suffix is ignored on both sides:
    the user may have copied an id from the inference side's dispatch log. No filter selects every sample.
    """
    if not wanted:
        return True
    ids = {sample.request_id, *sample.request_ids} - {None}
    stripped = {join_keys.strip_vllm_suffix(wanted_id) for wanted_id in wanted}
    return any(join_keys.strip_vllm_suffix(str(request_id)) in stripped for request_id in ids)


def packs_samples(micro_batch: Any) -> bool:
    """Whether the engine packs the micro-batch's samples back to back into one row (verl's remove-padding
    input, the default) rather than padding each to a row of its own."""
    from verl.utils import tensordict_utils as tu

    return bool(tu.get(micro_batch, "use_remove_padding", True))
