"""The shim in fresh interpreters: off costs nothing, on activates, chaining, -S/-I, config errors."""

from __future__ import annotations

import sys

import pytest
from support import STANDINS
from support.interpreter import run_python, shim_env

from msprobe_hooks import config as config_module

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

REPORT = """
import json, os, sys
print(json.dumps({
    "ours": sorted(m for m in sys.modules if m.split(".")[0] in ("msprobe_hooks", "wrapt")),
    "heavy": sorted(m for m in ("torch", "msprobe", "verl", "vllm", "sglang", "ray") if m in sys.modules),
    "active": "msprobe_hooks" in sys.modules and sys.modules["msprobe_hooks"].current_config() is not None,
    "user_runs": os.environ.get("USER_SITECUSTOMIZE_RUNS"),
    "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
}))
"""


@pytest.mark.parametrize("value", [None, "", "0", "false", "no", "off", "OFF", " False "])
def test_off_imports_neither_the_package_nor_wrapt(value):
    env = shim_env() if value is None else shim_env(DUMP_ON=value)
    result = run_python(REPORT, env)
    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["ours"] == []
    assert report["active"] is False
    assert result.stderr == ""


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_on_activates_without_importing_any_target(value):
    result = run_python(REPORT, shim_env(DUMP_ON=value))
    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["active"] is True
    assert "msprobe_hooks" in report["ours"]
    assert "wrapt" not in report["ours"]  # imported only once a patch is applied
    assert report["heavy"] == []


def test_on_in_an_interpreter_without_the_package_is_silent():
    # The base interpreter this venv was made from: it inherits the environment (shim and all)
    # but cannot import msprobe_hooks.
    base = sys._base_executable
    assert base != sys.executable
    result = run_python(REPORT, shim_env(STANDINS / "user_site", DUMP_ON="1"), python=base)
    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["ours"] == [] and report["user_runs"] == "1"
    assert result.stderr == ""


@pytest.mark.parametrize("dump_on", ["0", "1"])
def test_a_shadowed_sitecustomize_still_runs_exactly_once(dump_on):
    result = run_python(REPORT, shim_env(STANDINS / "user_site", DUMP_ON=dump_on))
    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["user_runs"] == "1"
    assert report["sitecustomize"] == str(STANDINS / "user_site" / "sitecustomize.py")
    assert report["active"] is (dump_on == "1")


def test_a_raising_chained_sitecustomize_is_reported_and_activation_stands():
    result = run_python(REPORT, shim_env(STANDINS / "raising_site", DUMP_ON="1"))
    assert result.returncode == 0, result.stderr
    assert result.json()["active"] is True
    assert "the user's sitecustomize is broken" in result.stderr
    assert result.stderr.count("\n") == 1  # one line


def test_without_a_shadowed_sitecustomize_ours_stays_registered():
    result = run_python(REPORT, shim_env(DUMP_ON="1"))
    assert result.json()["sitecustomize"].endswith("sitecustomize_shim/sitecustomize.py")


@pytest.mark.parametrize("flag", ["-S", "-I"])
def test_no_site_and_isolated_interpreters_never_activate(flag):
    result = run_python(REPORT, shim_env(STANDINS / "user_site", DUMP_ON="1"), flag)
    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["ours"] == [] and report["user_runs"] is None


BAD_VALUES = [
    ("DUMP_ON", "maybe", "accepted: 1/0, true/false"),
    ("DUMP_PHASE", "lgo_prob", "accepted: log_prob, update_actor, all"),
    ("PROMPTS_ONLY", "2", "accepted: 0, 1, trim"),
    ("DUMP_SEQUENCES", "maybe", "accepted: 1/0, true/false"),
    ("DUMP_REQUEST_IDS", "req-1,,req-2", "accepted: comma-separated request ids"),
    ("DUMP_REQUEST_IDS", "req-1,req 2", "(no empty item, no space inside an id)"),
    ("MSPROBE_HOOKS_GAP_THRESHOLD", "0", "accepted: a positive number"),
    ("MSPROBE_HOOKS_GAP_THRESHOLD", "-0.5", "accepted: a positive number"),
    ("MSPROBE_HOOKS_GAP_THRESHOLD", "nan", "accepted: a positive number"),
    ("MSPROBE_HOOKS_GAP_THRESHOLD", "ten", "accepted: a positive number"),
    ("MSPROBE_ACTOR_CONFIG", "/does/not/exist.json", "(no such file)"),
    ("MSPROBE_GENERATE_CONFIG", "/does/not/exist.json", "(no such file)"),
    ("MSPROBE_HOOKS_STRICT", "sure", "accepted: 1/0"),
    # /proc: not writable even for root, whom access() lets through everywhere but on read-only mounts
    ("MSPROBE_HOOKS_OUTPUT_DIR", "/proc/x", "(/proc is on a filesystem that holds no files"),
    ("MSPROBE_HOOKS_OUTPUT_DIR", "/proc/self/x", "(/proc/self is not writable)"),
    ("MSPROBE_HOOKS_OUTPUT_DIR", "/dev/null/x", "(/dev/null is not a directory)"),
    ("MSPROBE_HOOKS_DISABLE", "verl.nope", "(unknown verl.nope)"),
    ("MSPROBE_HOOKS_LOG_LEVEL", "LOUD", "accepted: DEBUG, INFO, WARNING, ERROR"),
    ("MSPROBE_HOOKS_PREFLIGHT", "strict", "accepted: warn, error"),
    ("MSPROBE_HOOKS_GENERATE_FORWARDS", "extend", "accepted: prefill, all"),
    ("MSPROBE_HOOKS_GAP_TOKENS", "some", "accepted: dumped, all, none"),
    ("MSPROBE_HOOKS_ROUTING", "experts", "accepted: 1/0, true/false"),
    ("MSPROBE_HOOKS_EXTRA_PATCHES", "no_colon", "accepted: comma-separated module:attribute"),
    ("MSPROBE_HOOKS_EXTRA_PATCHES", "no_such_module:X", "ModuleNotFoundError"),
]


@pytest.mark.parametrize(("name", "value", "accepted"), BAD_VALUES, ids=[f"{n}={v}" for n, v, _ in BAD_VALUES])
def test_a_bad_value_stops_the_process_before_user_code_with_one_clear_line(name, value, accepted):
    env = shim_env(DUMP_ON="1")
    env[name] = value
    result = run_python("print('user code ran')", env)
    assert result.returncode == 2
    assert "user code ran" not in result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"msprobe-hooks: error: {name}={value!r} is not valid")
    assert accepted in lines[0]


def test_every_variable_with_validation_has_a_bad_value_case():
    from msprobe_hooks.config import VARIABLES

    covered = {name for name, _, _ in BAD_VALUES}
    validated = {v.name for v in VARIABLES if v.field}
    assert validated <= covered


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "top level is not an object"),
        ('{"task": "overflow_check"}', "task='overflow_check'"),
        ('{"level": "L3"}', "level='L3'"),
        ('{"level": "L2", "task": "statistics"}', "task tensor at L2"),
        ('{"step": 3}', "step=3"),
        ('{"rank": ["a-b"]}', "rank=['a-b']"),
        ('{"dump_path": ""}', "dump_path=''"),
        ('{"dump_path": "/proc/x/actor"}', "dump_path='/proc/x/actor': /proc is on a filesystem that holds no files"),
    ],
)
def test_a_config_msprobe_would_reject_stops_the_process(tmp_path, content, why):
    path = tmp_path / "config.json"
    path.write_text(content)
    result = run_python("print('user code ran')", shim_env(DUMP_ON="1", MSPROBE_ACTOR_CONFIG=str(path)))
    assert result.returncode == 2
    assert result.stderr.startswith(f"msprobe-hooks: error: MSPROBE_ACTOR_CONFIG='{path}' is not valid")
    assert why in result.stderr


def test_a_writable_dump_root_is_accepted_and_not_created_at_start_up(tmp_path):
    root = tmp_path / "not" / "yet"
    result = run_python("print('user code ran')", shim_env(DUMP_ON="1", MSPROBE_HOOKS_OUTPUT_DIR=str(root)))
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "not").exists()


def test_whole_sequences_cannot_be_dumped_from_a_trimmed_batch():
    # Each value is valid alone; together they ask for responses that the trim cuts off.
    result = run_python("print('user code ran')", shim_env(DUMP_ON="1", DUMP_SEQUENCES="1", PROMPTS_ONLY="trim"))
    assert result.returncode == 2 and "user code ran" not in result.stdout
    assert result.stderr.splitlines() == [
        "msprobe-hooks: error: DUMP_SEQUENCES='1' is not valid (PROMPTS_ONLY=trim cuts the responses off the "
        "batch: no whole sequence is left to dump); accepted: 0 with PROMPTS_ONLY=trim"
    ]


def test_every_bad_variable_is_reported_at_once():
    env = shim_env(DUMP_ON="1", DUMP_PHASE="x", PROMPTS_ONLY="y")
    result = run_python("pass", env)
    assert result.returncode == 2
    assert [line.split("=")[0] for line in result.stderr.splitlines()] == [
        "msprobe-hooks: error: DUMP_PHASE",
        "msprobe-hooks: error: PROMPTS_ONLY",
    ]


def test_unknown_msprobe_hooks_variables_are_reported_once_with_a_suggestion():
    env = shim_env(DUMP_ON="1", MSPROBE_HOOKS_STRIKT="1")
    code = "import msprobe_hooks; msprobe_hooks.activate(); print('ok')"
    result = run_python(code, env)
    assert result.returncode == 0
    warnings = [line for line in result.stderr.splitlines() if "MSPROBE_HOOKS_STRIKT" in line]
    assert len(warnings) == 1
    assert "did you mean MSPROBE_HOOKS_STRICT?" in warnings[0]


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("DUMP_PAHSE", "DUMP_PHASE"), ("MSPROBE_ACTOR_CONFG", "MSPROBE_ACTOR_CONFIG"), ("PROMPT_ONLY", "PROMPTS_ONLY")],
)
def test_near_misses_of_our_other_variables_get_the_same_suggestion(typo, meant):
    code = "import msprobe_hooks; msprobe_hooks.activate(); print('ok')"
    result = run_python(code, shim_env(DUMP_ON="1", **{typo: "all"}))
    assert result.returncode == 0
    warnings = [line for line in result.stderr.splitlines() if typo in line]
    assert len(warnings) == 1
    assert f"unknown variable {typo} ignored (did you mean {meant}?)" in warnings[0]


def test_other_tools_variables_in_our_prefixes_are_not_reported():
    # msprobe's own MSPROBE_LOG_LEVEL is six edits from MSPROBE_HOOKS_LOG_LEVEL;
    # the others are far from every name of ours.
    environ = {"MSPROBE_LOG_LEVEL": "INFO", "DUMP_PATH": "/x", "MSPROBE_DUMP_DIR": "/y", "PROMPT_TEMPLATE": "z"}
    assert config_module.load(environ).unknown_names == ()


def test_relative_paths_are_pinned_for_every_later_process(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    config = tmp_path / "a" / "config.json"
    config.write_text('{"task": "statistics", "level": "L1"}')
    child = (
        "import os, json, subprocess, sys; "
        "print(json.dumps([os.environ['MSPROBE_HOOKS_OUTPUT_DIR'], os.environ['MSPROBE_ACTOR_CONFIG']]))"
    )
    code = f"""
import subprocess, sys, json
out = subprocess.run([sys.executable, "-c", {child!r}], cwd={str(tmp_path / "b")!r},
                     capture_output=True, text=True, check=True).stdout
print(out.strip())
"""
    env = shim_env(DUMP_ON="1", MSPROBE_HOOKS_OUTPUT_DIR="dumps", MSPROBE_ACTOR_CONFIG="config.json")
    result = run_python(code, env, cwd=tmp_path / "a")
    assert result.returncode == 0, result.stderr
    assert result.json() == [str(tmp_path / "a" / "dumps"), str(config)]
