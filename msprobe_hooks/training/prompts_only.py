"""Prompts-only collection: which mode is in effect, and the published recipe's trim.

``PROMPTS_ONLY`` (``Config.prompts_only``) is ``off``, ``forward`` or ``trim``. ``forward`` is an
extra prompt-only forward inside the engine (training maths unchanged); where that forward cannot
run, the mode becomes ``trim``. :func:`mode` is the one rule, a pure function of the job
configuration: the trainer process (which trims) and the engine workers (which would run the
extra forward) evaluate it on the same configuration and so agree without talking to each other.

``trim`` is what the published msprobe recipe does by editing verl: before ``old_log_prob`` the
trainer cuts the response tokens off the batch, so every later forward (log-prob, ref, update)
sees the prompt alone, and the rollout-vs-actor debug metrics and the rollout correction return
early. The update of such a run is meaningless: collection runs only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from msprobe_hooks.config import PROMPTS_ONLY_MODES, Config

if TYPE_CHECKING:
    from msprobe_hooks.patching import PatchContext

log = logging.getLogger("msprobe_hooks")

OFF, FORWARD, TRIM = PROMPTS_ONLY_MODES

# Per-response-token fields the published recipe empties (both its padded v0 and jagged v1 forms);
# the later ones exist only when the trim runs after they were computed.
RESPONSE_FIELDS = (
    "responses",
    "response_mask",
    "loss_mask",
    "rollout_log_probs",
    "old_log_probs",
    "advantages",
    "rollout_is_weights",
    "ref_log_prob",
)

# The early-return value of calculate_debug_metrics in the published recipe.
SKIPPED_DEBUG_METRICS = {
    "training/rollout_probs_diff_valid": 0,
    "training/rollout_probs_diff_max": 0.0,
    "training/rollout_probs_diff_mean": 0.0,
    "training/rollout_probs_diff_std": 0.0,
    "training/rollout_actor_probs_pearson_corr": 0.0,
}

_trimmed = False  # a batch of this process has been trimmed: the early returns apply from now on


def mode(config: Config | None, pipeline_parallel_size: int = 1) -> str:
    """The prompts-only mode in effect: ``off``, ``forward`` or ``trim``.

    ``forward`` (``PROMPTS_ONLY=1``) becomes ``trim`` where an extra prompt-only forward is
    impossible: with pipeline parallelism (Megatron PP > 1) the forward is driven by the pipeline
    schedule's point-to-point exchanges, and an extra one deadlocks it. An engine patch that finds
    ``trim`` here runs no extra forward and dumps the real one, which the trainer has already cut.
    """
    if config is None or config.prompts_only == OFF:
        return OFF
    if config.prompts_only == FORWARD and pipeline_parallel_size <= 1:
        return FORWARD
    return TRIM


def _select(node: Any, path: str) -> Any:
    for key in path.split("."):
        node = node.get(key) if hasattr(node, "get") else getattr(node, key, None)
        if node is None:
            return None
    return node


def trainer_pipeline_parallel_size(trainer_config: Any) -> int:
    """The actor's pipeline parallel size from verl's job configuration (1 unless Megatron)."""
    if _select(trainer_config, "actor_rollout_ref.actor.strategy") != "megatron":
        return 1
    return int(_select(trainer_config, "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size") or 1)


def bypass_mode(trainer_config: Any) -> bool:
    """Whether old log-probs are taken from the rollout instead of recomputed (no old_log_prob forward)."""
    return bool(_select(trainer_config, "algorithm.rollout_correction.bypass_mode"))


def prefix_rows(tensor: Any, lengths: Sequence[int]) -> Any:
    """Row ``i`` of ``tensor`` cut to its first ``lengths[i]`` entries along the last dimension.

    A jagged nested tensor stays jagged (with its ragged last dimension, as verl builds 3-D mRoPE
    position ids); a dense one stays dense when every row keeps the same length.
    """
    import torch

    if not tensor.is_nested and len(set(lengths)) == 1:
        return tensor[..., : lengths[0]]
    rows = [row[..., :length] for row, length in zip(tensor.unbind(), lengths, strict=True)]
    values = torch.cat(rows, dim=-1)
    offsets = torch.tensor([0, *lengths], dtype=torch.int64, device=values.device).cumsum(0)
    return torch.nested.nested_tensor_from_jagged(values, offsets, jagged_dim=rows[0].dim())


def trim_padded(batch: Any) -> None:
    """The published v0 trim, in place on a DataProto's TensorDict (left-padded prompts, right-padded
    responses): the sequence fields lose their last ``responses.size(1)`` columns, the per-response
    fields become empty. All or nothing: the batch changes only once every cut has been made."""
    keep = batch["input_ids"].size(-1) - batch["responses"].size(-1)
    cut = {key: batch[key][..., :keep] for key in ("input_ids", "attention_mask", "position_ids") if key in batch}
    cut.update({key: batch[key][..., :0] for key in RESPONSE_FIELDS if key in batch})
    for key, tensor in cut.items():
        batch[key] = tensor


def trim_jagged(data: Any) -> Any:
    """The published v1 trim of a jagged TensorDict: the fields to write back.

    Each sample keeps its own prompt length (``prompts`` is jagged, or dense when all prompts
    happen to have one length): ``input_ids`` and ``position_ids`` (2-D or 3-D mRoPE) are cut to
    it, the per-response fields become empty.
    """
    from tensordict import TensorDict

    prompts = data["prompts"]
    size = data.batch_size[0]
    prompt_lengths = prompts.offsets().diff().tolist() if prompts.is_nested else [prompts.size(-1)] * size
    fields = {key: prefix_rows(data[key], prompt_lengths) for key in ("input_ids", "position_ids")}
    for key in RESPONSE_FIELDS:
        if key in data:
            fields[key] = prefix_rows(data[key], [0] * size)
    return TensorDict(fields, batch_size=data.batch_size)


def _trim_if_due(config: Config | None, trainer_config: Any, trim: Callable[[], None]) -> int | None:
    """The pipeline parallel size the trim was decided on, once ``trim`` ran; None when not in trim mode."""
    pipeline_parallel_size = trainer_pipeline_parallel_size(trainer_config)
    if mode(config, pipeline_parallel_size) != TRIM or bypass_mode(trainer_config):
        return None
    trim()
    return pipeline_parallel_size


def trim_before_old_log_prob(ctx: PatchContext, trainer_config: Any, trim: Callable[[], None]) -> None:
    """Run ``trim`` when this job is in trim mode (``ctx.config``); called by the trainer patches before old_log_prob.

    Guarded (``ctx.guarded``): a trim that fails logs one line and leaves the batch as it was
    (full-sequence dumps, undisturbed training) rather than stopping the job.
    """
    global _trimmed
    config = ctx.config
    pipeline_parallel_size = ctx.guarded(
        "the PROMPTS_ONLY trim (the batch is left whole)", _trim_if_due, config, trainer_config, trim
    )
    if pipeline_parallel_size is None:
        return
    if not _trimmed:
        _trimmed = True
        explicit = config is not None and config.prompts_only == TRIM
        why = (
            "PROMPTS_ONLY=trim"
            if explicit
            else f"PROMPTS_ONLY=1 with pipeline parallel size {pipeline_parallel_size} (no extra forward possible)"
        )
        log.warning(
            "%s: responses are cut off the batch before old_log_prob, as in the published recipe; "
            "the policy update of this run is meaningless (collection runs only)",
            why,
        )


def batch_trimmed() -> bool:
    """Whether this process has trimmed a batch: debug metrics and rollout correction then return early."""
    return _trimmed
