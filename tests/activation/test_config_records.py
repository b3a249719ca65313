"""The Variable records are the one statement of each variable: Config, parsing, defaults and messages follow them."""

from __future__ import annotations

import pytest

from msprobe_hooks import config
from msprobe_hooks.config import VARIABLES, Choice

CHOICES = [var for var in VARIABLES if var.field and isinstance(var.kind, Choice)]


def test_config_has_one_field_per_record():
    fields = [var.field for var in VARIABLES if var.field]
    assert len(fields) == len(set(fields))
    assert set(config.Config._fields) == {*fields, "unknown_names"}


def test_an_unset_or_blank_variable_reads_as_its_record_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    unset = config.load({})
    blank = config.load({var.name: "  " for var in VARIABLES})
    for var in VARIABLES:
        if var.field:
            assert getattr(unset, var.field) == var.parse(var.default, str(tmp_path)), var.name
            assert getattr(blank, var.field) == getattr(unset, var.field), var.name
    assert unset.output_dir == str(tmp_path / "msprobe_dump")


@pytest.mark.parametrize("var", CHOICES, ids=[var.name for var in CHOICES])
def test_every_choice_is_read_in_any_case_and_the_default_is_one(var):
    assert var.parse(var.default, "/") in var.kind.values
    for value in var.kind.values:
        assert getattr(config.load({var.name: f" {value.swapcase()} "}), var.field) == value


@pytest.mark.parametrize("var", CHOICES, ids=[var.name for var in CHOICES])
def test_a_bad_choice_names_what_the_record_accepts(var):
    with pytest.raises(config.ConfigError) as caught:
        config.load({var.name: "nonsense"})
    assert caught.value.problems == [f"{var.name}='nonsense' is not valid; accepted: {var.accepted}"]
    assert all(value in var.accepted for value in var.kind.values)


def test_an_alias_reads_as_what_it_stands_for():
    assert config.load({"DUMP_PHASE": "forward_only"}).dump_phase == config.LOG_PROB
    assert config.VARIABLE["DUMP_PHASE"].accepted == "log_prob, update_actor, all (forward_only = log_prob)"


@pytest.mark.parametrize(("raw", "mode"), [("1", "forward"), ("yes", "forward"), ("0", "off"), ("TRIM", "trim")])
def test_prompts_only_reads_a_switch_or_trim(raw, mode):
    assert config.load({"PROMPTS_ONLY": raw}).prompts_only == mode
    assert mode in config.PROMPTS_ONLY_MODES


def test_every_problem_is_reported_at_once_in_record_order():
    with pytest.raises(config.ConfigError) as caught:
        config.load({"MSPROBE_HOOKS_LOG_LEVEL": "LOUD", "DUMP_ON": "maybe", "DUMP_PHASE": "x"})
    assert [problem.split("=", 1)[0] for problem in caught.value.problems] == [
        "DUMP_ON",
        "DUMP_PHASE",
        "MSPROBE_HOOKS_LOG_LEVEL",
    ]


def test_the_reference_table_shows_each_record():
    table = config.reference_table().splitlines()
    for var, line in zip(VARIABLES, table[2:], strict=True):
        assert line == f"| `{var.name}` | {var.default_text} | {var.accepted} | {var.meaning} |"


@pytest.mark.parametrize(("raw", "disabled"), [("verl.fsdp", True), ("vllm.model_runner", False), ("*", True)])
def test_a_patch_is_disabled_by_its_name_or_by_every_patch(raw, disabled):
    assert config.load({"MSPROBE_HOOKS_DISABLE": raw}).patch_disabled("verl.fsdp") is disabled


def test_request_ids_and_the_gap_threshold_are_read_as_written():
    loaded = config.load({"DUMP_REQUEST_IDS": " req-1 , 4f2a-0123abcd,req-1", "MSPROBE_HOOKS_GAP_THRESHOLD": " 1e-2 "})
    assert loaded.dump_request_ids == frozenset({"req-1", "4f2a-0123abcd"})  # vLLM's suffix: stripped where compared
    assert loaded.gap_threshold == 0.01
    assert config.load({}).dump_request_ids == frozenset() and config.load({}).gap_threshold == 0.1
