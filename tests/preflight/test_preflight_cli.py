"""``msprobe-hooks preflight`` on config files and launch commands, and ``msprobe-hooks recipe``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from omegaconf import OmegaConf
from support import REPO
from support.interpreter import clean_env

from msprobe_hooks import cli, preflight
from msprobe_hooks.preflight import recipe, verl_config
from msprobe_hooks.preflight.verl_config import ConfigSourceError

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

MAIN = ["python3", "-m", "verl.trainer.main_ppo"]


@pytest.fixture
def generate_config(tmp_path) -> str:
    path = tmp_path / "generate_config.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L0"}))
    return str(path)


@pytest.fixture
def environ(monkeypatch):
    """The CLI reads this process's environment: start it without any variable of ours."""
    kept = clean_env()
    for name in [name for name in os.environ if name not in kept]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    return monkeypatch


def _recipe_overrides(generate_config: str, backend: str = "fsdp", gpus: int = 4) -> list[str]:
    return recipe.build(backend, gpus, rollout="vllm-ascend", generate_config=generate_config).overrides


def _run(capsys, *argv: str) -> tuple[int, list[str], str]:
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def test_a_clean_launch_command_passes(capsys, environ, generate_config):
    command = [*MAIN, "actor_rollout_ref.rollout.name=vllm", *_recipe_overrides(generate_config)]
    status, out, _ = _run(capsys, "preflight", "--rollout-backend", "vllm-ascend", "--", *command)
    assert status == 0
    assert out == [f"msprobe-hooks preflight: launch command: no findings ({len(preflight.RULES)} rules)"]


def test_a_launch_command_with_violations_lists_each_once(capsys, environ, generate_config):
    command = [
        *MAIN,
        "actor_rollout_ref.rollout.name=vllm",
        *_recipe_overrides(generate_config),
        "trainer.balance_batch=True",
        "actor_rollout_ref.rollout.enable_prefix_caching=True",
    ]
    status, out, _ = _run(capsys, "preflight", "--rollout-backend", "vllm-ascend", "--", *command)
    assert status == 1
    assert out[0] == "msprobe-hooks preflight: launch command: 2 findings; this run's dumps cannot be paired"
    assert [line.split("]")[0] for line in out[1:]] == ["  [balance-batch", "  [prefix-caching"]
    assert out[1].endswith("fix: trainer.balance_batch=False")


def test_a_command_given_as_one_string_takes_its_leading_assignments_as_environment(capsys, environ, generate_config):
    environ.delenv("TORCHDYNAMO_DISABLE")
    overrides = " ".join(_recipe_overrides(generate_config))
    line = (
        f"TORCHDYNAMO_DISABLE=1 PROMPTS_ONLY=trim python3 -u -m verl.trainer.main_ppo "
        f"actor_rollout_ref.rollout.name=vllm {overrides} algorithm.rollout_correction.rollout_is=token"
    )
    status, out, _ = _run(capsys, "preflight", "--rollout-backend", "vllm-ascend", line)
    assert status == 1
    assert [line.split("]")[0] for line in out[1:]] == ["  [rollout-correction"]


def test_config_path_and_name_are_resolved_as_hydra_does(capsys, environ, generate_config, tmp_path):
    folder = tmp_path / "conf"
    folder.mkdir()
    (folder / "my_run.yaml").write_text(
        textwrap.dedent(
            """\
            defaults:
              - ppo_trainer
              - _self_
            trainer:
              val_before_train: true
            """
        )
    )
    command = [
        *MAIN,
        f"--config-path={folder}",
        "-cn",
        "my_run",
        "actor_rollout_ref.rollout.name=vllm",
        *[o for o in _recipe_overrides(generate_config) if not o.startswith("trainer.val_before_train")],
    ]
    status, out, _ = _run(capsys, "preflight", "--rollout-backend", "vllm-ascend", "--", *command)
    assert status == 1
    assert [line.split("]")[0] for line in out[1:]] == ["  [val-before-train"]


def test_a_relative_config_path_is_relative_to_the_entry_point(tmp_path):
    script = tmp_path / "app" / "main.py"
    (tmp_path / "app" / "conf").mkdir(parents=True)
    (tmp_path / "app" / "conf" / "base.yaml").write_text("a: 1\nactor_rollout_ref:\n  rollout:\n    n: 3\n")
    decorator = "@hydra.main(config_path='conf', config_name='base', version_base=None)"
    script.write_text(f"import hydra\n\n{decorator}\ndef main(cfg):\n    pass\n")
    config, environ = verl_config.from_command(["X=1", "python", "app/main.py", "a=2"], cwd=str(tmp_path))
    assert (config.a, config.actor_rollout_ref.rollout.n, environ) == (2, 3, {"X": "1"})


def test_a_saved_config_file_is_checked_as_it_is(capsys, environ, generate_config, tmp_path):
    config = verl_config.compose(
        verl_config.verl_config_dir(),
        "ppo_trainer",
        ["actor_rollout_ref.rollout.name=vllm", *_recipe_overrides(generate_config), "trainer.val_before_train=True"],
    )
    saved = tmp_path / ".hydra" / "config.yaml"
    saved.parent.mkdir()
    OmegaConf.save(config, saved)
    status, out, _ = _run(capsys, "preflight", "--rollout-backend", "vllm-ascend", str(saved))
    assert status == 1
    assert out[0].startswith(f"msprobe-hooks preflight: {saved}: 1 finding;")
    assert out[1].startswith("  [val-before-train]")


def test_a_primary_config_file_is_composed_with_the_installed_verl(capsys, environ, generate_config, tmp_path):
    dotlist = OmegaConf.from_dotlist([o.lstrip("+") for o in _recipe_overrides(generate_config)])
    body = OmegaConf.to_yaml(OmegaConf.merge(dotlist, {"actor_rollout_ref": {"rollout": {"name": "vllm"}}}))
    path = tmp_path / "run.yaml"
    path.write_text("defaults:\n  - ppo_trainer\n  - _self_\n" + body)
    status, out, _ = _run(capsys, "preflight", "--rollout-backend", "vllm-ascend", str(path))
    assert (status, out[0].split(": ")[-1]) == (0, f"no findings ({len(preflight.RULES)} rules)")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["preflight"], "give a verl config file, or -- and a launch command"),
        (["preflight", "/no/such/run.yaml"], "/no/such/run.yaml: no such file"),
        (["preflight", "--", "bash", "run.sh"], "no python interpreter in the command"),
        (["preflight", "--", "python3", "-m", "no_such_pkg.main"], "module no_such_pkg.main is not on"),
        (["preflight", "--", *MAIN, "no_such_key=1"], "cannot compose 'ppo_trainer'"),
        (["preflight", "--", *MAIN, "--multirun"], "Hydra option --multirun is not supported"),
        (["preflight", "--", "python3", "-m", "msprobe_hooks.cli"], "has no @hydra.main entry point"),
    ],
)
def test_a_source_that_cannot_be_read_exits_2_with_one_line(capsys, environ, argv, message):
    status, out, _ = _run(capsys, *argv)
    assert status == 2
    assert len(out) == 1 and out[0].startswith("msprobe-hooks preflight: error: ")
    assert message in out[0]


def test_a_yaml_file_that_is_a_list_is_rejected(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigSourceError, match="top level is a list"):
        verl_config.from_file(str(path))


def test_a_bad_variable_in_the_environment_exits_2(capsys, environ, generate_config):
    environ.setenv("MSPROBE_HOOKS_PREFLIGHT", "maybe")
    command = [*MAIN, "actor_rollout_ref.rollout.name=vllm"]
    status, _, err = _run(capsys, "preflight", "--", *command)
    assert status == 2
    assert "MSPROBE_HOOKS_PREFLIGHT='maybe' is not valid; accepted: warn, error" in err


def _recipe_output(capsys, *argv: str) -> tuple[dict[str, str], list[str]]:
    status, out, err = _run(capsys, "recipe", *argv)
    assert status == 0, err
    exports = dict(line.removeprefix("export ").split("=", 1) for line in out if line.startswith("export "))
    overrides = [line.strip().removesuffix(" \\") for line in out if line.startswith("    ")]
    return exports, overrides


@pytest.mark.parametrize(
    ("argv", "engine"),
    [
        (["--backend", "fsdp", "--gpus", "8", "--rollout", "vllm-ascend"], "dp"),
        (["--backend", "fsdp", "--gpus", "2", "--nnodes", "2", "--rollout", "vllm"], "dp"),
        (["--backend", "megatron", "--gpus", "8", "--tp", "2", "--rollout", "sglang"], "megatron"),
        (["--backend", "megatron", "--gpus", "4", "--ep", "2", "--rollout", "vllm-ascend"], "megatron"),
    ],
    ids=["fsdp-ascend", "fsdp-gpu-2-nodes", "megatron-sglang-tp2", "megatron-ascend-ep2"],
)
def test_recipe_output_fed_back_into_preflight_finds_nothing(capsys, environ, generate_config, argv, engine):
    environ.delenv("TORCHDYNAMO_DISABLE")
    exports, overrides = _recipe_output(capsys, *argv, "--generate-config", generate_config)
    for name, value in exports.items():
        environ.setenv(name, value)
    rollout = argv[argv.index("--rollout") + 1]
    name = "sglang" if rollout == "sglang" else "vllm"
    command = [*MAIN, f"model_engine={engine}", f"actor_rollout_ref.rollout.name={name}", *overrides]
    status, out, _ = _run(capsys, "preflight", "--rollout-backend", rollout, "--", *command)
    assert (status, out[1:]) == (0, [])


def test_recipe_sizes_follow_the_layout(capsys, environ, generate_config):
    _, overrides = _recipe_output(capsys, "--backend", "megatron", "--gpus", "8", "--tp", "4", "--rollout", "vllm")
    assert "actor_rollout_ref.rollout.n=2" in overrides
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=4" in overrides
    _, overrides = _recipe_output(capsys, "--backend", "fsdp", "--gpus", "8", "--nnodes", "2", "--rollout", "vllm")
    assert "actor_rollout_ref.rollout.n=16" in overrides
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=16" in overrides


def test_recipe_rejects_an_impossible_layout(capsys, environ):
    status, out, err = _run(capsys, "recipe", "--backend", "megatron", "--gpus", "8", "--tp", "3")
    assert (status, out) == (2, [])
    assert err.strip() == "msprobe-hooks recipe: error: --tp 3 does not divide the 8 cards"


@pytest.mark.parametrize(
    ("version", "switches"),
    [
        ("0.7.1", ["actor_rollout_ref.rollout.skip_rollout"]),
        ("0.8.0", ["actor_rollout_ref.rollout.skip.enable"]),
        ("0.9.1", ["skip.rollout.enable", "skip.rollout_tq.enable", "skip.async_rollout.enable"]),
    ],
)
def test_recipe_puts_the_rollout_skip_switches_where_each_verl_has_them(version, switches):
    assert list(recipe.skip_switches(version)) == switches


def test_recipe_passes_verl_s_own_config_validation(generate_config, tmp_path):
    """verl's validate_config (batch divisibility, micro-batch settings) accepts the recipe, FSDP and Megatron."""
    code = f"""
        import json
        from msprobe_hooks.preflight import recipe
        from msprobe_hooks.preflight import verl_config
        from verl.utils.config import validate_config
        for backend, engine in (("fsdp", "dp"), ("megatron", "megatron")):
            overrides = recipe.build(backend, 8, tensor_parallel=2 if engine == "megatron" else 1,
                                     generate_config={generate_config!r}).overrides
            config = verl_config.compose(verl_config.verl_config_dir(), "ppo_trainer",
                [f"model_engine={{engine}}", "actor_rollout_ref.rollout.name=vllm", "algorithm.adv_estimator=grpo",
                 *overrides])
            validate_config(config, use_reference_policy=True, use_critic=False)
        print(json.dumps("validated"))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=clean_env(), cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == '"validated"'


def test_the_console_command_is_wired(tmp_path, generate_config):
    overrides = _recipe_overrides(generate_config)
    command = [*MAIN, "actor_rollout_ref.rollout.name=vllm", *overrides, "trainer.balance_batch=True"]
    done = subprocess.run(
        [sys.executable, "-m", "msprobe_hooks", "preflight", "--rollout-backend", "vllm-ascend", "--", *command],
        env=clean_env(TORCHDYNAMO_DISABLE="1"),
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines()[1].startswith("  [balance-batch]")
