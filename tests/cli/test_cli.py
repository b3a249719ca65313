"""The msprobe-hooks command: shim-path, env, run, ray-env (with verl's real Hydra config), doctor."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, STANDINS
from support.interpreter import clean_env, shim_env

from msprobe_hooks.cli.launch import shim_dir

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

PROBE = "import json, msprobe_hooks; print(json.dumps(msprobe_hooks.current_config() is not None))"


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "msprobe_hooks", *args],
        env=clean_env() if env is None else env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_shim_path_is_the_folder_holding_the_shim():
    done = cli("shim-path")
    assert done.returncode == 0
    assert Path(done.stdout.strip(), "sitecustomize.py").is_file()
    assert done.stdout.strip() == shim_dir()


def test_env_exports_activate_a_shell(tmp_path):
    python = shlex.quote(sys.executable)
    script = f'eval "$({python} -m msprobe_hooks env)" && {python} -c {shlex.quote(PROBE)}'
    script += ' && echo "$MSPROBE_HOOKS_OUTPUT_DIR"'
    done = subprocess.run(["bash", "-c", script], env=clean_env(), cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    active, output_dir = done.stdout.split()
    assert json.loads(active) is True
    assert output_dir == str(tmp_path / "msprobe_dump")


def test_env_keeps_the_users_values():
    done = cli("env", env=clean_env(DUMP_PHASE="all", PROMPTS_ONLY="trim"))
    assert "export DUMP_PHASE=all" in done.stdout.splitlines()
    assert "export PROMPTS_ONLY=trim" in done.stdout.splitlines()


def test_run_execs_the_command_with_the_shim_first_and_pinned_paths(tmp_path):
    code = (
        "import json, os, msprobe_hooks; print(json.dumps([msprobe_hooks.current_config() is not None, "
        "os.environ['PYTHONPATH'], os.environ['MSPROBE_HOOKS_OUTPUT_DIR']]))"
    )
    env = clean_env(DUMP_ON="1", PYTHONPATH=f"/somewhere:{shim_dir()}")
    done = cli("run", "--", sys.executable, "-c", code, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    active, pythonpath, output_dir = json.loads(done.stdout)
    assert active is True
    assert pythonpath == f"{shim_dir()}:/somewhere"  # first, and only once
    assert output_dir == str(tmp_path / "msprobe_dump")


def test_run_passes_the_exit_status_through():
    done = cli("run", "--", sys.executable, "-c", "raise SystemExit(7)", env=clean_env(DUMP_ON="1"))
    assert done.returncode == 7


def test_run_refuses_a_bad_configuration_before_starting_the_command(tmp_path):
    marker = tmp_path / "ran"
    env = clean_env(DUMP_ON="1", DUMP_PHASE="sometimes")
    done = cli("run", "--", "touch", str(marker), env=env)
    assert done.returncode == 2
    assert not marker.exists()
    assert done.stderr.startswith("msprobe-hooks: error: DUMP_PHASE='sometimes' is not valid")


def test_run_reports_a_missing_command():
    done = cli("run", "--", "no-such-command-xyz", env=clean_env(DUMP_ON="1"))
    assert done.returncode == 127
    assert "cannot run 'no-such-command-xyz'" in done.stderr


def test_ray_env_json_is_all_strings_with_a_literal_complete_pythonpath(tmp_path):
    env = clean_env(PYTHONPATH="/opt/a:/opt/b", MSPROBE_HOOKS_OUTPUT_DIR="rel", DUMP_PHASE="all")
    done = cli("ray-env", "--format", "json", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    env_vars = json.loads(done.stdout)["env_vars"]
    assert env_vars == {
        "PYTHONPATH": f"{shim_dir()}:/opt/a:/opt/b",
        "DUMP_ON": "1",
        "DUMP_PHASE": "all",
        "MSPROBE_HOOKS_OUTPUT_DIR": str(tmp_path / "rel"),
    }


def test_ray_env_refuses_values_hydra_would_interpolate():
    done = cli("ray-env", env=clean_env(PYTHONPATH="/opt/${HOME}"))
    assert done.returncode == 2
    assert "cannot be passed through Hydra" in done.stderr


@pytest.mark.parametrize("existing", [False, True])
def test_ray_env_overrides_compose_with_verls_real_config_into_strings(tmp_path, existing):
    """The printed overrides, fed to verl 0.9.1's own Hydra config and resolved as verl resolves it."""
    done = cli("ray-env", env=clean_env(PYTHONPATH="/opt/a"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    overrides = shlex.split(done.stdout.replace("\\\n", " "))
    if existing:  # the user's script already sets one of the keys
        overrides.insert(0, '+ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH="/old"')
    code = f"""
import json, os
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
import verl.trainer.main_ppo as main_ppo
config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")
with initialize_config_dir(config_dir=config_dir, version_base=None):
    cfg = compose(config_name="ppo_trainer", overrides={overrides!r})
OmegaConf.resolve(cfg)  # what verl's TaskRunner does later; fails on ${{...}}
env_vars = OmegaConf.to_container(cfg.ray_kwargs.ray_init.runtime_env.env_vars)
print(json.dumps({{k: [type(v).__name__, v] for k, v in env_vars.items()}}))
"""
    result = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    env_vars = json.loads(result.stdout.splitlines()[-1])
    assert env_vars["DUMP_ON"] == ["str", "1"]
    assert env_vars["PYTHONPATH"] == ["str", f"{shim_dir()}:/opt/a"]
    assert env_vars["MSPROBE_HOOKS_OUTPUT_DIR"] == ["str", str(tmp_path / "msprobe_dump")]


def test_doctor_reports_the_winning_sitecustomize_and_what_it_chains():
    done = cli("doctor", env=shim_env(STANDINS / "user_site", DUMP_ON="1"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"winning sitecustomize: ours; it chains: {STANDINS / 'user_site' / 'sitecustomize.py'}" in out
    assert "ran in this process: yes" in out
    assert "active in this process: yes" in out
    assert "export TORCHDYNAMO_DISABLE=1" in out
    assert "mindstudio-probe 26.2.0 (supported)" in out


def test_doctor_says_when_another_sitecustomize_wins():
    env = clean_env(PYTHONPATH=f"{STANDINS / 'user_site'}:{shim_dir()}", DUMP_ON="1")
    done = cli("doctor", env=env)
    assert f"! winning sitecustomize is {STANDINS / 'user_site' / 'sitecustomize.py'}, not ours" in done.stdout
    assert "active in this process: no" in done.stdout


def test_doctor_lists_every_patch_with_its_eligibility():
    env = shim_env(
        STANDINS / "fake_site",
        DUMP_ON="1",
        MSPROBE_HOOKS_EXTRA_PATCHES="fake_patches:GOOD,fake_patches:TOO_NEW,fake_patches:DRIFTED",
    )
    done = cli("doctor", env=env)
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  test.")}
    assert "eligible (fake-target 1.2.0)" in lines["test.fake_engine"]
    assert "would be skipped: requires fake-target>=2, found 1.2.0" in lines["test.too_new"]
    assert "would be skipped, target changed" in lines["test.drifted"]
    assert "fake_target" not in done.stdout.split("patches")[0]  # nothing imported to find out


def test_doctor_with_a_bad_configuration_exits_2_naming_it():
    env = clean_env(DUMP_PHASE="often")  # DUMP_ON off: the doctor process itself starts fine
    done = cli("doctor", env=env)
    assert done.returncode == 2
    assert "! DUMP_PHASE='often' is not valid" in done.stdout


def test_doctor_spawn_check_proves_activation_in_every_kind_of_child(ray_tmp):
    env = shim_env(DUMP_ON="1", RAY_TMPDIR=ray_tmp)
    done = cli("doctor", "--spawn-check", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    section = done.stdout.split("spawn check")[1]
    for kind in ("spawn", "fork", "subprocess", "ray task"):
        assert any(line.split(" active")[0].strip() == kind for line in section.splitlines()), section


def test_doctor_spawn_check_fails_when_children_cannot_activate(ray_tmp):
    # DUMP_ON is on but the shim is not on PYTHONPATH: no child can activate.
    env = clean_env(DUMP_ON="1", RAY_TMPDIR=ray_tmp)
    done = cli("doctor", "--spawn-check", env=env)
    assert done.returncode == 1
    assert done.stdout.count("NOT ACTIVE") == 4
    assert "on PYTHONPATH: no" in done.stdout


def test_python_dash_m_and_the_console_script_are_the_same_command():
    script = Path(sys.executable).with_name("msprobe-hooks")
    done = subprocess.run([str(script), "shim-path"], env=clean_env(), capture_output=True, text=True)
    assert done.stdout == cli("shim-path").stdout
    assert os.access(script, os.X_OK)


def test_ray_env_output_reads_into_a_bash_array_as_the_user_guide_shows(tmp_path):
    python = shlex.quote(sys.executable)
    script = f'eval "RAY_ENV=($({python} -m msprobe_hooks ray-env))"; printf "%s\\n" "${{RAY_ENV[@]}}"'
    done = subprocess.run(
        ["bash", "-c", script], env=clean_env(PYTHONPATH="/opt/a"), cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f'++ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH="{shim_dir()}:/opt/a"',
        '++ray_kwargs.ray_init.runtime_env.env_vars.DUMP_ON="1"',
        f'++ray_kwargs.ray_init.runtime_env.env_vars.MSPROBE_HOOKS_OUTPUT_DIR="{tmp_path / "msprobe_dump"}"',
    ]


# Every command with the declared dependencies alone (wrapt, packaging, mindstudio-probe): verl's
# stack and torch are made unimportable, as in an inference-only container or an analysis laptop.
WITHOUT_VERL = """
import sys

class Blocked:
    TOP = ("omegaconf", "hydra", "verl", "torch")

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.TOP:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, Blocked())
from msprobe_hooks import cli
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["shim-path"],
        ["env"],
        ["run", "--", sys.executable, "-c", "pass"],
        ["ray-env", "--format", "json"],
        ["doctor"],
        ["recipe", "--backend", "fsdp", "--gpus", "8", "--rollout", "vllm"],
        ["preflight", "--help"],
        ["align", "--help"],
        ["compare", "--help"],
        ["gaps", "--help"],
    ],
)
def test_every_command_runs_without_verl_s_config_stack(argv, tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_VERL, *argv], env=clean_env(), cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_preflight_of_a_config_without_verl_s_config_stack_says_so_in_one_line(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("trainer: {}\n")
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_VERL, "preflight", str(config)], env=clean_env(), capture_output=True, text=True
    )
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "verl's config stack" in lines[0] and "omegaconf" in lines[0], lines


# What a command loads of the package: the command line and its own module, never the domain (no patch,
# training, inference or analysis code for shim-path and the command list).
LOADED = """
import contextlib, io, json, sys
from msprobe_hooks import cli
with contextlib.redirect_stdout(io.StringIO()):
    try:
        cli.main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith("msprobe_hooks"))))
"""
LIGHT = {
    "msprobe_hooks",
    "msprobe_hooks.cli",
    "msprobe_hooks.cli.command",
    "msprobe_hooks.config",
    "msprobe_hooks.record",
}


@pytest.mark.parametrize(
    ("argv", "own"),
    [
        (["shim-path"], {"msprobe_hooks.cli.shim_path", "msprobe_hooks.cli.launch"}),
        (["--help"], set()),
        (
            ["compare", "--help"],
            {
                "msprobe_hooks.cli.compare",
                "msprobe_hooks.analysis",
                "msprobe_hooks.analysis.results",
                "msprobe_hooks.analysis.table",  # the results' column kinds (standard library only)
            },
        ),
    ],
)
def test_the_command_line_loads_nothing_of_the_domain(argv, own, tmp_path):
    done = subprocess.run([sys.executable, "-c", LOADED, *argv], env=clean_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout.splitlines()[-1])) == LIGHT | own


def test_the_wheel_installs_into_a_clean_venv_and_works_there(tmp_path):
    """``make dist``'s wheel: what a user carries into a cluster's container. Installed with no dependencies
    (none reachable in a locked container is the worst case), the shim activates and the command answers."""
    wheels = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("msprobe_hooks-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, capture_output=True
    )
    shim = subprocess.run(
        [str(venv / "bin" / "msprobe-hooks"), "shim-path"], capture_output=True, text=True, check=True
    )
    assert shim.stdout.strip().startswith(str(venv)) and Path(shim.stdout.strip(), "sitecustomize.py").is_file()
    # the built-in name map travels with the package
    assert list(venv.rglob("msprobe_hooks/analysis/comparing/name_map.yaml"))
    on = clean_env(DUMP_ON="1", PYTHONPATH=shim.stdout.strip(), MSPROBE_HOOKS_OUTPUT_DIR=str(tmp_path / "out"))
    probe = "import json, sys; print(json.dumps(sys.modules['msprobe_hooks'].current_config() is not None))"
    active = subprocess.run([str(python), "-c", probe], env=on, capture_output=True, text=True)
    assert active.returncode == 0 and active.stdout.strip() == "true", active.stderr


def test_a_reader_that_goes_away_gets_no_traceback(tmp_path):
    # `msprobe-hooks align ... | head`: the pipe's only reader is gone before the command writes.
    golden = REPO / "tests" / "golden" / "fsdp2" / "actor", REPO / "tests" / "golden" / "vllm" / "generate"
    command = [sys.executable, "-m", "msprobe_hooks", "align", *map(str, golden), "-o", str(tmp_path / "p.jsonl")]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    child.stdout.close()
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=120) == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr
