"""vLLM-Ascend: its native debugger stays in charge; dumps per process; lines carry its step{N}.

The stand-in NPUModelRunner (tests/standins/vllm_site/vllm_ascend) starts and steps its own real msprobe
PrecisionDebugger where each release does: inline after _prepare_inputs (0.12-0.19), before
_update_states (0.20-0.23), after it (0.24+), with the scheduled tokens (0.27+). Its worker applies
vLLM-Ascend's own patch of GPUModelRunner._update_states (as 0.13 does) after msprobe-hooks patched vLLM.
"""

from __future__ import annotations

import pytest
from support.vllm_standin import (
    MIXED,
    MIXED_ROWS,
    dispatch_log,
    dump_of,
    dumped_steps,
    generate_config,
    row_tuples,
    run_scenario,
)

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

ASCEND = {**MIXED, "worker_cls": "vllm_ascend.worker.worker.NPUWorker"}
INSPECT = """
from msprobe_hooks import debugger
import vllm_ascend.patch.worker.patch_model_runner as ascend_patch
runner = standin_drive.LAST_ENGINE.model_executor.worker.model_runner
report["ascend_patch_ran"] = len(ascend_patch.PATCHED_CALLS)
report["follows_native"] = runner.debugger.__wrapped__ is debugger.existing()
report["made_by_us"] = debugger._created_for is not None
"""


@pytest.mark.parametrize("version", ["0.12.0rc1", "0.13.0", "0.23.0", "0.25.1rc1", "0.30.0rc2"])
def test_native_dumps_go_per_process_and_lines_name_their_folders(tmp_path, version):
    config = generate_config(tmp_path, step=[0, 2, 4])
    key = "dump_config" if version == "0.12.0rc1" else "dump_config_path"
    scenario = {**ASCEND, "additional_config": {key: str(config)}}
    result = run_scenario(tmp_path, scenario, code=INSPECT, vllm_ascend=version)
    assert result.returncode == 0, result.stderr
    assert f"applied patch vllm_ascend.model_runner to vllm-ascend {version}" in result.stderr
    assert "re-applied vllm.model_runner to GPUModelRunner._update_states, replaced since import" in result.stderr
    report = result.json()
    assert report["ascend_patch_ran"] > 0
    assert (report["follows_native"], report["made_by_us"]) == (True, False)
    root, pid = tmp_path / "gen", report["pid"]
    lines = dispatch_log(root, pid)
    assert {(line["engine"], line["engine_version"]) for line in lines} == {("vllm-ascend", version)}
    steps = [(line["step"], line["dumped"]) for line in lines]
    assert steps == [(0, True), (1, False), (2, True), (3, False), (4, True)]
    assert [row_tuples(line) for line in lines] == MIXED_ROWS
    assert dumped_steps(root, pid) == ["step0", "step2", "step4"]
    assert sorted(p.name for p in root.iterdir()) == [str(pid)]  # nothing in the shared root itself
    for line in lines[0], lines[2], lines[4]:
        embedding = dump_of(root, pid, line["step"])["Module.embed_tokens.Embedding.forward.0"]
        assert embedding["input_args"][0]["shape"] == [line["total_num_scheduled_tokens"]]


def test_without_a_native_dump_config_the_log_alone_is_written(tmp_path):
    result = run_scenario(tmp_path, ASCEND, vllm_ascend="0.23.0")
    assert result.returncode == 0, result.stderr
    lines = dispatch_log(tmp_path / "out" / "generate", result.json()["pid"])
    assert [(line["step"], line["dumped"], line["engine"]) for line in lines] == [
        (step, False, "vllm-ascend") for step in range(5)
    ]


def test_msprobe_generate_config_is_not_used_on_vllm_ascend(tmp_path):
    ours = generate_config(tmp_path)
    native = tmp_path / "native.json"
    native.write_text(ours.read_text().replace(str(tmp_path / "gen"), str(tmp_path / "native")))
    scenario = {**ASCEND, "additional_config": {"dump_config_path": str(native)}}
    result = run_scenario(tmp_path, scenario, code=INSPECT, vllm_ascend="0.25.1rc1", MSPROBE_GENERATE_CONFIG=str(ours))
    assert result.returncode == 0, result.stderr
    assert "MSPROBE_GENERATE_CONFIG is not used on vLLM-Ascend" in result.stderr
    report = result.json()
    assert (report["follows_native"], report["made_by_us"]) == (True, False)
    assert not (tmp_path / "gen").exists()
    assert dumped_steps(tmp_path / "native", report["pid"]) == [f"step{n}" for n in range(5)]


def test_the_ascend_patch_steps_aside_without_the_vllm_patch(tmp_path):
    config = generate_config(tmp_path)
    scenario = {**ASCEND, "additional_config": {"dump_config_path": str(config)}}
    result = run_scenario(tmp_path, scenario, vllm_ascend="0.25.1rc1", MSPROBE_HOOKS_DISABLE="vllm.model_runner")
    assert result.returncode == 0, result.stderr
    assert "skipped patch vllm_ascend.model_runner: needs patch vllm.model_runner, which is not applied" in (
        result.stderr
    )
    pid = result.json()["pid"]
    assert not (tmp_path / "gen" / str(pid)).exists()  # vLLM-Ascend's own behaviour, untouched
    native_dumps = sorted(p.parent.parent.name for p in (tmp_path / "gen").glob("step*/rank*/dump.json"))
    assert native_dumps == [f"step{n}" for n in range(5)]
