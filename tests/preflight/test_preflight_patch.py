"""Patch ``verl.preflight``: the check runs in verl's own entry point, through the real activation path.

The fresh-interpreter tests run verl 0.9.1's ``main_ppo`` with the shim and DUMP_ON=1. What comes
after the check (``run_ppo``: Ray, workers, rollouts) is replaced by a stand-in that only records
that it was reached; the real ``python -m verl.trainer.main_ppo`` is run once, where the check stops it.
"""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import sys
import types
from importlib import metadata

import pytest
from support.interpreter import run_python, shim_env

from msprobe_hooks import config as config_module
from msprobe_hooks import patching, preflight
from msprobe_hooks.cli import doctor
from msprobe_hooks.patches.verl import VERL_PREFLIGHT
from msprobe_hooks.patches.verl import preflight as implementation
from msprobe_hooks.preflight import recipe, verl_config

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

STAND_IN = """
    import json, sys
    from verl.trainer import main_ppo

    reached = []
    main_ppo.run_ppo = lambda config, task_runner_class: reached.append(config.actor_rollout_ref.rollout.n)
    sys.argv = ["main_ppo", *{argv!r}]
    try:
        main_ppo.main()
    except SystemExit as exc:
        print(json.dumps({{"reached": reached, "exit": exc.code}}))
        raise
    print(json.dumps({{"reached": reached, "exit": 0}}))
"""


@pytest.fixture(scope="module")
def generate_config(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("gen") / "generate_config.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L0"}))
    return str(path)


def _argv(generate_config: str, *extra: str) -> list[str]:
    overrides = recipe.build("fsdp", 2, rollout="vllm", generate_config=generate_config).overrides
    # grpo: no critic, whose model verl's validate_config would load; output dirs stay in the test folder.
    return ["actor_rollout_ref.rollout.name=vllm", "algorithm.adv_estimator=grpo", *overrides, *extra]


VIOLATIONS = ("trainer.balance_batch=True", "actor_rollout_ref.rollout.enable_prefix_caching=True")


def test_python_m_main_ppo_stops_before_ray_with_every_finding(tmp_path):
    """Under ``-m`` main_ppo runs as __main__, never imported as verl.trainer.main_ppo: the hook still fires. The job
    joins a cluster started apart without ray-env's runtime_env: that one mistake would leave every worker inactive."""
    address = "+ray_kwargs.ray_init.address=127.0.0.1:6379"
    done = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", "actor_rollout_ref.rollout.name=vllm", address],
        env=shim_env(DUMP_ON="1"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "ray init kwargs" not in done.stdout  # run_ppo prints it just before ray.init
    assert "PreflightFailed: msprobe-hooks preflight: verl config: " in done.stderr
    for rule in ("batch-size", "rollout-n", "eager-rollout", "prefix-caching", "torchdynamo", "inference-dump-config"):
        assert f"  [{rule}] " in done.stderr
    assert "  [ray-runtime-env] the job joins the Ray cluster at 127.0.0.1:6379, started apart" in done.stderr
    assert 'eval "RAY_ENV=($(msprobe-hooks ray-env))"' in done.stderr  # what to do about it
    assert "stopped before Ray starts" in done.stderr


def test_a_clean_run_reaches_what_comes_after(tmp_path, generate_config):
    env = shim_env(DUMP_ON="1", TORCHDYNAMO_DISABLE="1", MSPROBE_GENERATE_CONFIG=generate_config)
    result = run_python(STAND_IN.format(argv=_argv(generate_config)), env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.json() == {"reached": [2], "exit": 0}
    assert "msprobe-hooks preflight: verl config: no findings" in result.stderr


def test_error_mode_stops_the_entry_point_before_what_comes_after(tmp_path, generate_config):
    env = shim_env(DUMP_ON="1", TORCHDYNAMO_DISABLE="1", MSPROBE_GENERATE_CONFIG=generate_config)
    result = run_python(STAND_IN.format(argv=_argv(generate_config, *VIOLATIONS)), env, cwd=tmp_path)
    assert result.returncode == 1
    assert result.json() == {"reached": [], "exit": 1}
    assert "verl config: 2 findings" in result.stderr
    assert "  [balance-batch] trainer.balance_batch is True, needs False" in result.stderr


def test_warn_mode_logs_one_line_per_finding_and_goes_on(tmp_path, generate_config):
    env = shim_env(
        DUMP_ON="1", MSPROBE_HOOKS_PREFLIGHT="warn", TORCHDYNAMO_DISABLE="1", MSPROBE_GENERATE_CONFIG=generate_config
    )
    result = run_python(STAND_IN.format(argv=_argv(generate_config, *VIOLATIONS)), env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.json() == {"reached": [2], "exit": 0}
    ours = [line for line in result.stderr.splitlines() if line.startswith("[msprobe-hooks ")]
    warnings = [line.split(" WARNING ", 1)[1] for line in ours if " WARNING " in line]
    assert len(warnings) == 3, result.stderr  # the header, then one line per finding
    assert warnings[0].startswith("msprobe-hooks preflight: verl config: 2 findings")
    assert warnings[1].startswith("  [balance-batch] ") and warnings[2].startswith("  [prefix-caching] ")


def test_without_dump_on_nothing_is_checked(tmp_path, generate_config):
    env = shim_env()
    result = run_python(STAND_IN.format(argv=_argv(generate_config, *VIOLATIONS)), env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.json() == {"reached": [2], "exit": 0}
    assert "msprobe-hooks" not in result.stderr


# --- the wrapper, in this process, on a stand-in device module ------------------------------------


@pytest.fixture(scope="module")
def clean_config(generate_config):
    overrides = recipe.build("fsdp", 2, rollout="vllm", generate_config=generate_config).overrides
    return verl_config.compose(
        verl_config.verl_config_dir(), "ppo_trainer", ["actor_rollout_ref.rollout.name=vllm", *overrides]
    )


@pytest.fixture
def device_module(monkeypatch, generate_config):
    """A stand-in for verl.utils.device whose auto_set_device sets the device as verl does on Ascend."""
    module = types.ModuleType("stand_in_device")
    module.calls = []
    module.detected = None

    def auto_set_device(config):
        module.calls.append(config)
        if config == "raise":
            raise KeyError("from verl")
        if module.detected:
            config.trainer.device = module.detected
        return "verl's result"

    module.auto_set_device = auto_set_device
    settings = config_module.load(
        {"DUMP_ON": "1", "TORCHDYNAMO_DISABLE": "1", "MSPROBE_GENERATE_CONFIG": generate_config}
    )
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    patching.apply(VERL_PREFLIGHT, module, config=settings)
    yield module
    patching.revert(VERL_PREFLIGHT.name)


def test_a_clean_config_passes_and_the_result_is_verl_s(device_module, clean_config):
    assert device_module.auto_set_device(clean_config) == "verl's result"
    assert device_module.calls == [clean_config]


def test_the_check_reads_the_config_after_verl_set_the_device(device_module, clean_config):
    device_module.detected = "npu"  # on Ascend: the rollout is vLLM-Ascend, which needs its own dump key
    with pytest.raises(implementation.PreflightFailed) as caught:
        device_module.auto_set_device(config=copy.deepcopy(clean_config))
    assert "[inference-dump-config] vLLM-Ascend rollout without additional_config.dump_config_path" in str(caught.value)


def test_verl_s_exception_passes_unchanged_and_nothing_is_checked(device_module, monkeypatch):
    checked = []
    monkeypatch.setattr(preflight, "check", lambda *args, **kwargs: checked.append(args) or [])
    with pytest.raises(KeyError, match="from verl"):
        device_module.auto_set_device("raise")
    assert checked == []


def test_configs_of_other_entry_points_are_left_alone(device_module, monkeypatch):
    from omegaconf import OmegaConf

    checked = []
    monkeypatch.setattr(preflight, "check", lambda *args, **kwargs: checked.append(args) or [])
    sft = OmegaConf.create({"trainer": {"device": "cuda"}, "model": {"path": "x"}})
    assert device_module.auto_set_device(sft) == "verl's result"
    assert checked == []


def test_a_failing_check_steps_aside_with_one_line(device_module, clean_config, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise AttributeError("a bug of ours")

    monkeypatch.setattr(preflight, "check", broken)
    monkeypatch.setattr(patching, "_failures_reported", set())
    ours = logging.getLogger("msprobe_hooks")
    monkeypatch.setattr(ours, "handlers", [caplog.handler])  # ours does not propagate to caplog's root handler
    monkeypatch.setattr(ours, "propagate", False)
    with caplog.at_level(logging.WARNING, logger="msprobe_hooks"):
        assert device_module.auto_set_device(clean_config) == "verl's result"
    assert [r.getMessage() for r in caplog.records] == [
        "patch verl.preflight: checking the run's configuration failed, the host goes on unaffected: "
        "AttributeError: a bug of ours"
    ]


def test_unpatch_restores_verl_s_function_and_stale_references_pass_through(device_module, clean_config, monkeypatch):
    stale = device_module.auto_set_device
    patching.revert(VERL_PREFLIGHT.name)
    assert not patching.is_ours(device_module.auto_set_device, VERL_PREFLIGHT.name)
    assert patching.wrapped_by(VERL_PREFLIGHT.name) == ()
    checked = []
    monkeypatch.setattr(preflight, "check", lambda *args, **kwargs: checked.append(args) or [])
    assert stale(clean_config) == "verl's result"
    assert checked == []
    patching.apply(VERL_PREFLIGHT, device_module)
    patching.apply(VERL_PREFLIGHT, device_module)  # idempotent: one wrapper
    assert device_module.auto_set_device.__wrapped__.__name__ == "auto_set_device"
    assert not patching.is_ours(device_module.auto_set_device.__wrapped__, VERL_PREFLIGHT.name)
    assert patching.wrapped_by(VERL_PREFLIGHT.name) == ((device_module, "auto_set_device"),)


def test_the_contract_holds_for_the_installed_verl():
    version = metadata.version("verl")
    assert patching.version_problem(VERL_PREFLIGHT, version) is None
    assert patching.contract_problems(VERL_PREFLIGHT, version) == []
    assert doctor.patch_eligibility(VERL_PREFLIGHT) == f"eligible (verl {version})"


def test_the_variable_defaults_to_error_and_rejects_other_values():
    assert config_module.load({}).preflight == "error"
    assert config_module.load({"MSPROBE_HOOKS_PREFLIGHT": " WARN "}).preflight == "warn"
    with pytest.raises(config_module.ConfigError) as caught:
        config_module.load({"MSPROBE_HOOKS_PREFLIGHT": "off"})
    assert caught.value.problems == ["MSPROBE_HOOKS_PREFLIGHT='off' is not valid; accepted: warn, error"]
