"""The PROMPTS_ONLY mode rule and the published recipe's trim, on real verl data structures.

Expected tensors are built independently of the trim: a v0 batch is assembled the way verl's
AgentLoopWorker assembles it (left-padded prompts, right-padded responses), and the recipe's result
is then, by construction, the prompt block alone; a v1 sample's result is its own prompt.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding

from msprobe_hooks import config as config_module
from msprobe_hooks.training import prompts_only

PROMPT_WIDTH, RESPONSE_WIDTH = 6, 5
PROMPTS = [[3, 4, 5], [6, 7, 8, 9, 10]]
RESPONSES = [[30, 31], [40, 41, 42, 43]]


def _config(prompts_only_raw: str) -> config_module.Config:
    return config_module.load({"DUMP_ON": "1", "PROMPTS_ONLY": prompts_only_raw})


@pytest.mark.parametrize(
    ("raw", "pipeline_parallel_size", "expected"),
    [
        ("0", 1, "off"),
        ("0", 4, "off"),
        ("1", 1, "forward"),
        ("1", 2, "trim"),
        ("trim", 1, "trim"),
        ("trim", 4, "trim"),
    ],
)
def test_mode_turns_forward_into_trim_only_where_no_extra_forward_can_run(raw, pipeline_parallel_size, expected):
    assert prompts_only.mode(_config(raw), pipeline_parallel_size) == expected


def test_mode_is_off_when_not_activated():
    assert prompts_only.mode(None, 8) == "off"


def test_pipeline_parallel_size_is_read_for_megatron_only():
    megatron = OmegaConf.create(
        {"actor_rollout_ref": {"actor": {"strategy": "megatron", "megatron": {"pipeline_model_parallel_size": 4}}}}
    )
    fsdp = OmegaConf.create(
        {"actor_rollout_ref": {"actor": {"strategy": "fsdp", "megatron": {"pipeline_model_parallel_size": 4}}}}
    )
    assert prompts_only.trainer_pipeline_parallel_size(megatron) == 4
    assert prompts_only.trainer_pipeline_parallel_size(fsdp) == 1
    assert prompts_only.trainer_pipeline_parallel_size(OmegaConf.create({})) == 1


def _left_pad(rows: list[list[int]], width: int) -> torch.Tensor:
    return torch.tensor([[0] * (width - len(row)) + row for row in rows])


def _right_pad(rows: list[list[int]], width: int) -> torch.Tensor:
    return torch.tensor([row + [0] * (width - len(row)) for row in rows])


def _mask(rows: list[list[int]], width: int, left: bool) -> torch.Tensor:
    pad = _left_pad if left else _right_pad
    return pad([[1] * len(row) for row in rows], width)


def _v0_batch(mrope: bool) -> tuple[DataProto, dict[str, torch.Tensor]]:
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


@pytest.mark.parametrize("mrope", [False, True], ids=["2d-position-ids", "3d-mrope-position-ids"])
def test_v0_trim_gives_the_published_recipe_tensors(mrope):
    batch, expected = _v0_batch(mrope)
    prompts_only.trim_padded(batch.batch)
    for key, tensor in expected.items():
        assert torch.equal(batch.batch[key], tensor), key
    for key in ("responses", "response_mask", "rollout_log_probs"):
        assert batch.batch[key].shape == (2, 0), key
    # Still a well-formed trainer batch: verl's own conversion for the actor accepts it.
    td = left_right_2_no_padding(batch.to_tensordict())
    assert [row.tolist() for row in td["input_ids"].unbind()] == PROMPTS


def test_v0_trim_leaves_a_batch_without_response_columns_whole():
    # The recipe slices [:, :-0] here, which would empty the sequences; keep them.
    batch, _ = _v0_batch(mrope=False)
    batch.batch["responses"] = batch.batch["responses"][:, :0]
    before = batch.batch["input_ids"].clone()
    prompts_only.trim_padded(batch.batch)
    assert torch.equal(batch.batch["input_ids"], before)


def _v1_samples(prompts: list[list[int]], mrope: bool) -> list[dict]:
    samples = []
    for prompt, response in zip(prompts, RESPONSES, strict=True):
        sequence = torch.tensor(prompt + response)
        positions = torch.arange(len(sequence))
        samples.append(
            {
                "prompts": torch.tensor(prompt),
                "responses": torch.tensor(response),
                "response_mask": torch.ones(len(response), dtype=torch.int64),
                "loss_mask": torch.ones(len(response), dtype=torch.int64),
                "rollout_log_probs": torch.full((len(response),), -0.5),
                "input_ids": sequence,
                "position_ids": torch.stack([positions + offset for offset in (0, 100, 200, 300)])
                if mrope
                else positions,
                "uid": "u",
            }
        )
    return samples


@pytest.mark.parametrize("mrope", [False, True], ids=["2d-position-ids", "3d-mrope-position-ids"])
@pytest.mark.parametrize("prompts", [PROMPTS, [[3, 4, 5], [6, 7, 8]]], ids=["ragged-prompts", "equal-prompts"])
def test_v1_trim_gives_the_published_recipe_tensors(prompts, mrope):
    data = tu.list_of_dict_to_tensordict(_v1_samples(prompts, mrope))
    trimmed = prompts_only.trim_jagged(data)
    assert trimmed["input_ids"].is_nested
    assert [row.tolist() for row in trimmed["input_ids"].unbind()] == prompts
    for row, sample, prompt in zip(trimmed["position_ids"].unbind(), _v1_samples(prompts, mrope), prompts, strict=True):
        assert torch.equal(row, sample["position_ids"][..., : len(prompt)])
    for key in ("responses", "response_mask", "loss_mask", "rollout_log_probs"):
        assert trimmed[key].is_nested, key
        assert trimmed[key].offsets().tolist() == [0, 0, 0], key
    assert set(trimmed.keys()) == {
        "input_ids",
        "position_ids",
        "responses",
        "response_mask",
        "loss_mask",
        "rollout_log_probs",
    }


def test_prefix_rows_keeps_the_ragged_dimension_last_for_mrope():
    rows = [torch.arange(8).reshape(4, 2), torch.arange(12).reshape(4, 3)]
    jagged = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    cut = prompts_only.prefix_rows(jagged, [1, 1])  # equal lengths: torch alone would pick dim 1
    assert [tuple(row.shape) for row in cut.unbind()] == [(4, 1), (4, 1)]
    assert torch.equal(cut.unbind()[1], rows[1][:, :1])
