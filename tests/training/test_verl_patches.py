"""The verl patches' records and activation, the native-profiler refusal, and reading micro-batches.

Activation tests run fresh interpreters with the shim; the micro-batch tests build verl's own
TensorDict layouts in this process (v1: jagged rows; v0: a padded batch through verl's
``left_right_2_no_padding``) and need no engine.
"""

from __future__ import annotations

import pytest
import torch
from support import REPO
from support.interpreter import run_python, shim_env

from cpu_kit import verl_cpu
from msprobe_hooks import contracts, join_keys
from msprobe_hooks.patches import PATCHES
from msprobe_hooks.training import micro_batch

verl_cpu.register_cpu_platform()

from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding  # noqa: E402

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

OURS = ("verl.fsdp_engine", "verl.megatron_engine", "verl.native_profiler_guard", "verl.legacy_actor")
VERL_PATCHES = [p for p in PATCHES if p.name in OURS]


@pytest.mark.parametrize("patch", VERL_PATCHES, ids=lambda p: p.name)
def test_contract_holds_for_the_installed_verl(patch) -> None:
    # verl.legacy_actor targets verl < 0.8: the installed 0.9.1 must fall outside its versions.
    if not contracts.version_supported("0.9.1", patch.versions):
        assert patch.name == "verl.legacy_actor"
        return
    for item in patch.contract:
        if contracts.applies(item, "0.9.1"):
            assert contracts.check_facts(item, contracts.installed_facts(item.module)) is None, item.describe()


GUARD = """
import json, sys
sys.path.insert(0, {repo!r})  # cpu_kit
from cpu_kit import verl_cpu
verl_cpu.register_cpu_platform()
from verl.utils.profiler.config import PrecisionDebuggerToolConfig, ProfilerConfig
from verl.utils.profiler.profile import DistProfiler
import verl.workers.engine.fsdp.transformer_impl as fsdp
from msprobe_hooks import bootstrap, patching
from msprobe_hooks.training.actor_dump import DumpRefused

def build(enable):
    try:
        DistProfiler(rank=0, config=ProfilerConfig(tool="precision_debugger", enable=enable,
                                                   tool_config=PrecisionDebuggerToolConfig()))
        return "built"
    except DumpRefused as exc:
        return "refused: " + str(exc)

def wrapped():
    return [patching.is_ours(vars(cls)[name], patch) for cls, name, patch in (
        (DistProfiler, "__init__", "verl.native_profiler_guard"),
        (fsdp.FSDPEngine, "forward_backward_batch", "verl.fsdp_engine"),
        (fsdp.FSDPEngineWithLMHead, "forward_step", "verl.fsdp_engine"))]

report = {{"enabled": build(True), "disabled": build(False), "wrapped": wrapped()}}
bootstrap.deactivate()
report.update(after_deactivate=wrapped(), enabled_after=build(True))
print(json.dumps(report))
"""


def test_verl_precision_debugger_profiler_is_refused_at_worker_start_and_patches_revert() -> None:
    result = run_python(GUARD.format(repo=str(REPO)), shim_env(DUMP_ON="1"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = result.json()
    assert report["enabled"].startswith("refused: DUMP_ON=1 and verl's global_profiler.tool=precision_debugger")
    assert report["disabled"] == "built"
    assert report["wrapped"] == [True, True, True]
    assert report["after_deactivate"] == [False, False, False]
    assert report["enabled_after"] == "built"


def _v0_batch(prompts: list[list[int]], responses: list[list[int]], mrope: bool) -> object:
    """A DataProto-style padded batch (left-padded prompts, right-padded responses) made jagged by verl."""
    width_p, width_r = max(map(len, prompts)), max(map(len, responses))
    rows_ids, rows_mask, rows_resp, rows_resp_mask, rows_prompt = [], [], [], [], []
    for p, r in zip(prompts, responses, strict=True):
        pad_p, pad_r = [0] * (width_p - len(p)), [0] * (width_r - len(r))
        rows_prompt.append(pad_p + p)
        rows_resp.append(r + pad_r)
        rows_ids.append(pad_p + p + r + pad_r)
        rows_mask.append([0] * len(pad_p) + [1] * (len(p) + len(r)) + [0] * len(pad_r))
        rows_resp_mask.append([1] * len(r) + [0] * len(pad_r))
    mask = torch.tensor(rows_mask)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    if mrope:
        positions = positions.unsqueeze(1).expand(-1, 4, -1) + torch.arange(4).view(1, 4, 1) * 100
    data = tu.get_tensordict(
        {
            "prompts": torch.tensor(rows_prompt),
            "responses": torch.tensor(rows_resp),
            "input_ids": torch.tensor(rows_ids),
            "attention_mask": mask,
            "response_mask": torch.tensor(rows_resp_mask),
            "position_ids": positions,
            "uid": ["u0", "pad1a2b"],
            # As the trainer side records them: the first turn's id, and every turn's.
            "request_id": ["turn-1", None],
            "inference_request_ids": [["turn-1", "turn-2"], None],
        },
        non_tensor_dict={"global_steps": 7},
    )
    return left_right_2_no_padding(data)


@pytest.mark.parametrize("mrope", [False, True], ids=["2d-positions", "3d-mrope-positions"])
def test_v0_layout_prompts_and_prompt_only_micro_batch(mrope: bool) -> None:
    prompts, responses = [[11, 12, 13], [21, 22, 23, 24, 25]], [[31, 32], [41]]
    batch = _v0_batch(prompts, responses, mrope)
    assert micro_batch.prompt_lengths(batch) == [3, 5]
    assert not micro_batch.is_trimmed(batch)
    samples = micro_batch.describe_samples(batch)
    assert [s.prompt_hash for s in samples] == [join_keys.prompt_hash(p) for p in prompts]
    assert [(s.request_id, s.request_ids) for s in samples] == [("turn-1", ["turn-1", "turn-2"]), (None, [])]
    assert [s.padding for s in samples] == [False, True]
    assert micro_batch.global_step_of(batch) == 7
    one = micro_batch.prompt_only_micro_batch(batch, 1, 5)
    assert one["input_ids"].values().tolist() == prompts[1]
    full_positions = batch["position_ids"].unbind()[1]
    assert torch.equal(one["position_ids"].unbind()[0], full_positions[..., :5])
    assert getattr(one["position_ids"], "_ragged_idx", 1) == getattr(batch["position_ids"], "_ragged_idx", 1)
    assert tu.get(one, "uid") == ["pad1a2b"]
    assert tu.get_non_tensor_data(one, "calculate_entropy", None) is False


def test_v1_layout_trimmed_and_equal_length_prompts() -> None:
    samples = [verl_cpu.Sample((5, 6, 7), (), "u0"), verl_cpu.Sample((8, 9, 10), (), "u1")]
    batch = verl_cpu.make_batch(samples)
    # Equal lengths: verl stacks the prompts densely; trimmed: every response is empty.
    assert not batch["prompts"].is_nested and micro_batch.prompt_lengths(batch) == [3, 3]
    assert micro_batch.is_trimmed(batch)
    described = micro_batch.describe_samples(batch)
    assert [(s.uid, s.session_id, s.request_ids, s.seq_len) for s in described] == [("u0", 0, [], 3), ("u1", 0, [], 3)]


@pytest.mark.parametrize("top_level", ["absent", "none"])
def test_v1_request_ids_are_read_from_each_samples_extra_fields(top_level: str) -> None:
    # A v1 (TransferQueue) micro-batch whose ids were not promoted to top-level fields (a custom
    # agent loop; our promotion stepped aside): the published recipe's extra_fields["request_id"].
    rows = []
    for i, extra in enumerate(
        [{"request_id": "turn-1", "inference_request_ids": ["turn-1", "turn-2"]}, {"request_id": "only"}, {}]
    ):
        row = {"input_ids": torch.arange(4 + i), "prompts": torch.arange(2 + i), "uid": f"u{i}", "extra_fields": extra}
        if top_level == "none":  # what promotion writes when it saw no id
            row.update(request_id=None, inference_request_ids=None)
        rows.append(row)
    described = micro_batch.describe_samples(tu.list_of_dict_to_tensordict(rows))
    assert [(s.request_id, s.request_ids) for s in described] == [
        ("turn-1", ["turn-1", "turn-2"]),
        ("only", ["only"]),
        (None, []),
    ]
