"""A verl v0 trainer batch (DataProto) as verl's agent loop assembles it, with the trim's expected result,
and the same kind of batch as the v0 trainer hands it to the engine (:func:`v0_engine_batch`).

Built independently of the trim: left-padded prompts, right-padded responses; what the published
recipe's trim must leave is, by construction, the prompt block alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from verl import DataProto

PROMPT_WIDTH, RESPONSE_WIDTH = 6, 5
PROMPTS = [[3, 4, 5], [6, 7, 8, 9, 10]]
RESPONSES = [[30, 31], [40, 41, 42, 43]]


def _left_pad(rows: list[list[int]], width: int) -> torch.Tensor:
    return torch.tensor([[0] * (width - len(row)) + row for row in rows])


def _right_pad(rows: list[list[int]], width: int) -> torch.Tensor:
    return torch.tensor([row + [0] * (width - len(row)) for row in rows])


def _mask(rows: list[list[int]], width: int, left: bool) -> torch.Tensor:
    pad = _left_pad if left else _right_pad
    return pad([[1] * len(row) for row in rows], width)


def v0_batch(mrope: bool) -> tuple[DataProto, dict[str, torch.Tensor]]:
    """A v0 trainer batch as verl's agent loop builds it, and the published recipe's expected tensors."""
    prompt_mask = _mask(PROMPTS, PROMPT_WIDTH, left=True)
    attention_mask = torch.cat([prompt_mask, _mask(RESPONSES, RESPONSE_WIDTH, left=False)], dim=1)
    position_ids = torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)
    prompt_position_ids = torch.clip(torch.cumsum(prompt_mask, dim=-1) - 1, min=0)
    if mrope:  # (bsz, 4, seq): text positions then 3 rope sections, as verl's Qwen-VL path
        position_ids = torch.stack([position_ids, position_ids + 100, position_ids + 200, position_ids + 300], dim=1)
        prompt_position_ids = torch.stack(
            [prompt_position_ids + offset for offset in (0, 100, 200, 300)],
            dim=1,
        )
    prompts = _left_pad(PROMPTS, PROMPT_WIDTH)
    responses = _right_pad(RESPONSES, RESPONSE_WIDTH)
    batch = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": _mask(RESPONSES, RESPONSE_WIDTH, left=False),
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "rollout_log_probs": torch.randn(2, RESPONSE_WIDTH),
            "rm_scores": torch.arange(2 * RESPONSE_WIDTH, dtype=torch.float32).reshape(2, RESPONSE_WIDTH),
        },
        non_tensors={"uid": np.array(["a", "b"], dtype=object)},
    )
    expected = {
        "input_ids": prompts,
        "attention_mask": prompt_mask,
        "position_ids": prompt_position_ids,
        "prompts": prompts,
        "rm_scores": batch.batch["rm_scores"].clone(),
    }
    return batch, expected


def v0_engine_batch(samples: Sequence[Any], micro_batch_size: int = 2, global_step: int = 1, **flags: Any) -> Any:
    """What verl's v0 trainer hands the engine's log-prob pass for ``samples`` (``cpu_kit.verl_cpu.Sample``).

    The DataProto as the agent loop pads it (left-padded prompts, right-padded responses, the rollout's
    log-probs padded with zeros to the response width, as ``_InternalAgentLoopOutput``), then
    ``RayPPOTrainer._compute_old_log_prob``'s own steps: ``to_tensordict`` and ``left_right_2_no_padding``.
    """
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    from cpu_kit import verl_cpu

    prompts = [list(s.prompt) for s in samples]
    responses = [list(s.response) for s in samples]
    prompt_width, response_width = max(map(len, prompts)), max(map(len, responses))
    prompt_mask = _mask(prompts, prompt_width, left=True)
    attention_mask = torch.cat([prompt_mask, _mask(responses, response_width, left=False)], dim=1)
    tensors = {
        "prompts": _left_pad(prompts, prompt_width),
        "responses": _right_pad(responses, response_width),
        "response_mask": _mask(responses, response_width, left=False),
        "attention_mask": attention_mask,
        "position_ids": torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
    }
    tensors["input_ids"] = torch.cat([tensors["prompts"], tensors["responses"]], dim=1)
    if any(s.rollout_log_probs is not None for s in samples):
        rows = [list(s.rollout_log_probs or [0.0] * len(s.response)) for s in samples]
        tensors["rollout_log_probs"] = torch.tensor([row + [0.0] * (response_width - len(row)) for row in rows])
    non_tensors = {"uid": np.array([s.uid for s in samples], dtype=object)}
    if any(s.request_id is not None for s in samples):
        non_tensors["request_id"] = np.array([s.request_id for s in samples], dtype=object)
    batch = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info={"global_steps": global_step})
    data = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(data, **verl_cpu.engine_settings(micro_batch_size, **flags))
    return data
