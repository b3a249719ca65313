"""The logits the hooks keep where msprobe leaves them out (``msprobe_hooks.inference.kept_logits``).

verl's own trainer runs them for real (``tests/inference/test_demo.py``: the healthy main_ppo run's rollout logits
read back by compare); here, what that run does not reach: nothing hooked where msprobe dumps the logits itself or
dumps statistics, nothing kept outside a dumped step, a copy that verl's masking in place afterwards leaves alone, a
failure that never reaches the forward, nothing written for a step msprobe did not dump.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from msprobe_hooks.inference.kept_logits import LogitsKeeper, keeper_for
from msprobe_hooks.join_keys import LOGITS_FILE


class Processor(torch.nn.Module):
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden * 2


def model() -> torch.nn.Module:
    found = torch.nn.Module()
    found.logits_processor = Processor()
    return found


def debugger(task: str) -> SimpleNamespace:
    return SimpleNamespace(config=SimpleNamespace(task=task))


def test_only_a_tensor_dump_that_left_the_logits_processor_out_is_kept_by_us() -> None:
    assert keeper_for(model(), debugger("statistics")) is None  # no values to check
    hooked = model()
    hooked.logits_processor.msprobe_hook = True  # msprobe's own mark: it dumps the logits itself
    assert keeper_for(hooked, debugger("tensor")) is None
    assert keeper_for(torch.nn.Module(), debugger("tensor")) is None  # no logits processor
    assert isinstance(keeper_for(model(), debugger("tensor")), LogitsKeeper)


def test_a_dumped_steps_logits_are_kept_as_they_came_out_and_written_beside_its_dump(tmp_path) -> None:
    found = model()
    keeper = keeper_for(found, debugger("tensor"))
    assert keeper is not None
    found.logits_processor(torch.ones(2, 3))  # a step msprobe does not dump
    assert keeper.kept is None
    keeper.armed = True
    logits = found.logits_processor(torch.arange(6.0).reshape(2, 3))
    logits[..., 2:] = float("-inf")  # what verl's compute_logits does to them afterwards, in place
    keeper.write(str(tmp_path))
    assert torch.equal(torch.load(tmp_path / LOGITS_FILE), torch.arange(6.0).reshape(2, 3) * 2)
    assert (keeper.kept, keeper.armed) == (None, False)


def test_nothing_is_written_for_a_step_msprobe_did_not_dump(tmp_path) -> None:
    keeper = LogitsKeeper()
    keeper.armed = True
    keeper.hook(None, (), torch.ones(1, 3))
    keeper.write(None)
    assert keeper.kept is None and not list(tmp_path.iterdir())


def test_a_failure_to_keep_them_never_reaches_the_forward_and_is_said_once(hook_warnings) -> None:
    keeper = LogitsKeeper()
    keeper.armed = True
    keeper.hook(None, (), ("not", "a", "tensor"))
    keeper.hook(None, (), ("not", "a", "tensor"))
    assert keeper.kept is None
    (said,) = hook_warnings()
    assert "the rollout's logits cannot be kept for the logits check" in said
