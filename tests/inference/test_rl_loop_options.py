"""The CPU kit's RL loop refuses, before any engine starts, an option the rollout engine it was given cannot apply: a
setting left unapplied would make a real-cause run prove nothing (``test_real_causes*.py`` run the loop itself)."""

from __future__ import annotations

import pytest

from cpu_kit import rl_loop

REQUIRED = ["--model", "m", "--prompts", "p.jsonl", "--out", "o"]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--rollout-engine", "sglang", "--kv-cache-dtype", "fp8_e4m3"], "--kv-cache-dtype"),
        (["--rollout-engine", "sglang", "--logprobs-mode", "processed_logprobs"], "--logprobs-mode"),
        (
            ["--rollout-engine", "sglang", "--rollout-hf-overrides", '{"head_dtype": "bfloat16"}'],
            "--rollout-hf-overrides",
        ),
        (["--rollout-engine-kwargs", '{"msprobe_dump_config": "c.json"}'], "--rollout-engine-kwargs"),
    ],
)
def test_an_option_of_the_other_engine_is_refused_by_name(options, named, capsys) -> None:
    with pytest.raises(SystemExit) as refused:
        rl_loop.main([*REQUIRED, *options])
    assert refused.value.code == 2
    assert named in capsys.readouterr().err.splitlines()[-1]
