"""Our own code raising inside a patched call: the host's call goes on unchanged, one line, raised under STRICT.

The trim, preflight and request-id patches run in a fresh interpreter under the shim with one of our
own functions made to fail (the place a layout we do not know would break it), called twice: one
line, not two. The prompt-only forward's own failure (cutting the prompts) runs on verl's real engine.
"""

from __future__ import annotations

import pytest
from support.interpreter import run_python, shim_env

from . import fault_matrix as fm
from .verl_faults import assert_stopped, assert_unchanged, faulted

PREAMBLE = """
import json, sys, types
import msprobe_hooks
from msprobe_hooks import bootstrap
from msprobe_hooks.log import logger

logger()  # as the patch machinery does before it imports a patch module

INJECTED = {injected!r}

def fail(*args, **kwargs):
    raise RuntimeError(INJECTED)
"""

CASES = {
    fm.TRIM: (
        """
from msprobe_hooks.patching import PatchContext
from msprobe_hooks.training import prompts_only
ctx = PatchContext("verl.trim_ray_trainer", None, bootstrap.current_config())
batch = {"input_ids": "whole"}
for _ in range(2):
    prompts_only.trim_before_old_log_prob(ctx, {}, fail)
print(json.dumps({"result": batch["input_ids"]}))
""",
        {"PROMPTS_ONLY": "trim"},
        "patch verl.trim_ray_trainer: the PROMPTS_ONLY trim (the batch is left whole) failed",
        "whole",
    ),
    fm.PREFLIGHT: (
        """
from msprobe_hooks import preflight
from msprobe_hooks.patching import PatchContext
from msprobe_hooks.patches.verl import preflight as implementation
preflight.is_ppo_config = fail
device = types.ModuleType("stand_in_device")
device.auto_set_device = lambda config: "verl's result"
implementation.patch(device, PatchContext("verl.preflight", None, bootstrap.current_config()))
results = [device.auto_set_device({"trainer": {}}) for _ in range(2)]
print(json.dumps({"result": results[0]}))
""",
        {},
        "patch verl.preflight: checking the run's configuration failed",
        "verl's result",
    ),
    fm.REQUEST_IDS: (
        """
import asyncio
from msprobe_hooks.patching import PatchContext
from msprobe_hooks.training import request_ids

class Fields(dict):
    def __setitem__(self, key, value):
        fail()

output = types.SimpleNamespace(extra_fields=Fields())

async def generate(*args, **kwargs):
    request_ids._note_sent("req-1")
    return output

wrappers = request_ids.ClientWrappers(PatchContext("verl.request_id_llm_server", None, bootstrap.current_config()))
results = [asyncio.run(wrappers.generate(generate, None, (), {})) is output for _ in range(2)]
print(json.dumps({"result": results}))
""",
        {},
        "patch verl.request_id_llm_server: stamping the TokenOutput with its request id failed",
        [True, True],
    ),
}


@pytest.mark.parametrize("target", CASES)
@pytest.mark.parametrize("strict", ["0", "1"])
def test_our_code_raising_inside_a_patch_is_one_line(target, strict, tmp_path):
    code, env, line, result = CASES[target]
    injected = f"one of our functions failed ({fm.INJECTED})"
    with fm.cell("our code raises inside the patch", target, strict=strict == "1") as tally:
        done = run_python(
            PREAMBLE.format(injected=injected) + code,
            shim_env(DUMP_ON="1", MSPROBE_HOOKS_OUTPUT_DIR=str(tmp_path / "out"), MSPROBE_HOOKS_STRICT=strict, **env),
        )
        tally.runs += 1
        lines = fm.our_lines(done.stderr)
        assert len(lines) == 1 and line in lines[0] and injected in lines[0], done.stderr[-3000:]
        if strict == "1":
            assert done.returncode == 1 and f"RuntimeError: {injected}" in done.stderr
            return
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.json() == {"result": result}


@pytest.mark.parametrize("strict", ["0", "1"])
def test_cutting_the_prompts_failing_skips_every_prompt_forward(strict, tmp_path, model_dir, baseline):
    with fm.cell("our code raises inside the patch", fm.PROMPTS_ONLY, strict=strict == "1") as tally:
        run = faulted(tmp_path, model_dir, "cut_prompts", PROMPTS_ONLY="1", MSPROBE_HOOKS_STRICT=strict)
        tally.runs += 1
        if strict == "1":
            assert_stopped(run, "cutting a prompt failed")
            return
        assert_unchanged(run, baseline)
        lines = fm.our_lines(run.stderr)
        assert len(lines) == 1 and "cutting the prompts failed" in lines[0], lines
        assert run.log_lines() == []  # no prompt dumped (the update is not dumped: DUMP_PHASE=log_prob)
        fm.check_logs(run.dump_root, tally)


@pytest.mark.parametrize("strict", ["0", "1"])
def test_the_log_prob_gap_failing_leaves_the_engine_and_its_dumps_as_they_were(strict, tmp_path, model_dir, baseline):
    # The batches carry the rollout's log-probs; the gap raises in each of the four log-prob micro-batches.
    with fm.cell("our code raises inside the patch", fm.LOGPROB_GAP, strict=strict == "1") as tally:
        run = faulted(tmp_path, model_dir, "gap", {"rollout_log_probs": True}, MSPROBE_HOOKS_STRICT=strict)
        tally.runs += 1
        if strict == "1":
            assert_stopped(run, "computing the log-prob gap failed")
            return
        assert_unchanged(run, baseline)
        lines = fm.our_lines(run.stderr)
        assert len(lines) == 1 and "patch verl.fsdp_engine: the log-prob gap failed" in lines[0], lines
        assert fm.INJECTED in lines[0]
        # The dumps are not the gap's: both log-prob passes' micro-batches are dumped and logged.
        assert [(line["phase"], line["micro_batch"]) for line in run.log_lines()] == [
            ("log_prob", 0),
            ("log_prob", 1),
        ] * 2
        assert not list(run.dump_root.glob("*/logprob_gap.jsonl"))
        fm.check_logs(run.dump_root, tally)
