"""The PROMPTS_ONLY mode rule and the published recipe's trim, on real verl data structures.

Expected tensors are built independently of the trim: a v0 batch is assembled the way verl's
AgentLoopWorker assembles it (left-padded prompts, right-padded responses), and the recipe's result
is then, by construction, the prompt block alone; a v1 sample's result is its own prompt.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from support.verl_batches import PROMPTS, RESPONSES, v0_batch
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding

from msprobe_hooks import config as config_module
from msprobe_hooks.training import prompts_only


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


@pytest.mark.parametrize("mrope", [False, True], ids=["2d-position-ids", "3d-mrope-position-ids"])
def test_v0_trim_gives_the_published_recipe_tensors(mrope):
    batch, expected = v0_batch(mrope)
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
    batch, _ = v0_batch(mrope=False)
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
