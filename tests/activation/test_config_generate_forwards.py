"""MSPROBE_HOOKS_GENERATE_FORWARDS: parsed and validated (the start-up exit is in test_shim.py's BAD_VALUES)."""

from __future__ import annotations

import pytest
from support.interpreter import clean_env

from msprobe_hooks import config

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)


@pytest.mark.parametrize(("raw", "expected"), [(None, "prefill"), ("all", "all"), (" ALL ", "all"), ("", "prefill")])
def test_values(raw, expected):
    env = clean_env()
    if raw is not None:
        env["MSPROBE_HOOKS_GENERATE_FORWARDS"] = raw
    assert config.load(env).generate_forwards == expected


def test_bad_value_is_one_line_naming_variable_value_and_accepted():
    with pytest.raises(config.ConfigError) as caught:
        config.load(clean_env(MSPROBE_HOOKS_GENERATE_FORWARDS="decode"))
    assert caught.value.problems == ["MSPROBE_HOOKS_GENERATE_FORWARDS='decode' is not valid; accepted: prefill, all"]


def test_documented_in_the_variable_table():
    assert "MSPROBE_HOOKS_GENERATE_FORWARDS" in config.reference_table()
