"""A real sampling cause with SGLang rolling out: the CPU kit's RL loop (``cpu_kit/rl_loop.py --rollout-engine
sglang``), SGLang 0.5.21's CPU engine (``.venv-sglang``) against verl's FSDP2 engine, fp32 on both sides, the hooks on
from the environment (SGLang dumps through its own switch, ``msprobe_dump_config``, as verl's ``engine_kwargs.sglang``
gives it). Two global steps each, the trained weights handed to the running SGLang engine between them
(``update_weights_from_disk``).

The rollout samples at temperature 0.8 and verl recomputes at 0.8 (it divides the logits by the rollout's
temperature). What SGLang returns is its own choice: by default the log-probs of logits / T, which match verl's
(``none``); with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` in its environment, those of the raw logits, which do not
(``sampling``, after the logits). Nothing but that variable differs between the two runs.

A third run (one global step) puts two more kinds on the SGLang engine only: another rope theta through SGLang's own
``json_model_override_args`` (``configuration``) and the first prompt fed with one token changed under its own request
id (``inputs``): the whole run's report says ``inputs`` (first in the rules' order), the other prompts'
``configuration``, as on vLLM (``test_real_causes.py``, with other values). SGLang's CPU engine refuses an fp8 KV
cache without AMX ("CPU FP8 KV cache requires Intel AMX support."), so that cause is proven on vLLM only.

Ground truth from an oracle independent of the tool and of both engines: transformers' forward of the same tokens on
the same checkpoint (with the rollout's rope theta where the rollout's log-probs are checked).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.rl_loop import (
    FP32_GAP,
    LoopRun,
    demo_inputs_in,
    largest_gap,
    oracle_log_probs,
    reference_model,
    run_sglang_loop,
)

from cpu_kit.rl_loop import token_gaps
from msprobe_hooks.join_keys import ENGINE_LOG, REQUESTS_LOG
from msprobe_hooks.numerics import RAW_LOGPROBS, TEMPERATURE_SCALED_LOGPROBS

pytestmark = pytest.mark.engine  # runs real engines (make test-fast leaves it out)

TEMPERATURE = 0.8  # the rollout's, and the one verl's recompute divides by
STEPS = 2
ROPE_THETA = 250000.0  # the SGLang rollout's (the checkpoint's is 10000)
CHANGED_AT = 3  # the position of the first prompt's token the rollout is fed changed
SAMPLED = ("--temperature", str(TEMPERATURE), "--train-temperature", str(TEMPERATURE), "--iterations", str(STEPS))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_inputs_in(tmp_path_factory.mktemp("inputs"))


@pytest.fixture(scope="module")
def tempered(tmp_path_factory: pytest.TempPathFactory, inputs: Path) -> LoopRun:
    """SGLang's default: the log-probs of logits / T."""
    return run_sglang_loop(tmp_path_factory.mktemp("sglang") / "tempered", inputs, *SAMPLED)


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory, inputs: Path) -> LoopRun:
    """``SGLANG_RETURN_ORIGINAL_LOGPROB=1``: the log-probs of the raw logits."""
    return run_sglang_loop(
        tmp_path_factory.mktemp("sglang") / "original", inputs, *SAMPLED, SGLANG_RETURN_ORIGINAL_LOGPROB="1"
    )


@pytest.fixture(scope="module")
def rope_and_token(tmp_path_factory: pytest.TempPathFactory, inputs: Path) -> LoopRun:
    """Greedy, one step: the rollout's rope theta through SGLang's own override, and the first prompt re-tokenized."""
    override = {"rope_parameters": {"rope_theta": ROPE_THETA, "rope_type": "default"}}
    return run_sglang_loop(
        tmp_path_factory.mktemp("sglang") / "rope_and_token",
        inputs,
        *("--iterations", "1", "--rollout-token-change", str(CHANGED_AT)),
        engine_kwargs={"json_model_override_args": json.dumps(override)},
    )


@pytest.fixture(scope="module")
def reference(inputs: Path) -> torch.nn.Module:
    return reference_model(inputs / "model")


@pytest.fixture(scope="module")
def rope_reference(inputs: Path) -> torch.nn.Module:
    """The checkpoint in transformers with the rollout's rope theta."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(inputs / "model")
    config.rope_parameters = {**config.rope_parameters, "rope_theta": ROPE_THETA}
    return reference_model(inputs / "model", config=config)


def recorded(run: LoopRun, name: str) -> list[dict]:
    (path,) = run.generate_root.glob(f"*/{name}")
    return [json.loads(line) for line in path.read_text().splitlines()]


def largest_token_gap(samples: list[dict]) -> float:
    return max(max(token_gaps(sample)) for sample in samples)


def test_sglangs_own_tempered_log_probs_match_verls_recompute_and_nothing_is_named(tempered: LoopRun, reference):
    (engine,) = recorded(tempered, ENGINE_LOG)
    assert (engine["engine"], engine["numerics"]["logprobs_mode"]) == ("sglang", TEMPERATURE_SCALED_LOGPROBS)
    assert {line["sampling"]["temperature"] for line in recorded(tempered, REQUESTS_LOG)} == {TEMPERATURE}
    diagnosis = tempered.diagnosis()
    assert (diagnosis["cause"], diagnosis["path"], diagnosis["module"]) == ("none", None, None), diagnosis
    # The oracle: SGLang's log-probs are of logits / T, as verl's; at step 2 too, so the trained weights reached the
    # running engine (the update moves log-probs by far more than fp32 noise: the other test's step-2 gap).
    for sample in tempered.samples(1):
        rollout = oracle_log_probs(reference, sample, TEMPERATURE)
        assert largest_gap(rollout, sample["rollout_log_probs"]) < FP32_GAP
    for step in range(1, STEPS + 1):
        assert largest_token_gap(tempered.samples(step)) < FP32_GAP, step


def test_sglang_returning_the_raw_log_probs_against_verls_tempered_recompute_is_sampling(original: LoopRun, reference):
    (engine,) = recorded(original, ENGINE_LOG)
    assert engine["numerics"]["logprobs_mode"] == RAW_LOGPROBS  # read from SGLang's sampler, not from us
    diagnosis = original.diagnosis()
    assert (diagnosis["cause"], diagnosis["path"], diagnosis["module"]) == ("sampling", "after the logits", None)
    assert diagnosis["evidence"][0] == f"log-probs temperature 1.0 (rollout) vs {TEMPERATURE} (training)"
    # The oracle: SGLang's log-probs are of the raw logits, verl's of logits / T, each to fp32 noise.
    for sample in original.samples(1):
        assert largest_gap(oracle_log_probs(reference, sample), sample["rollout_log_probs"]) < FP32_GAP
        training = oracle_log_probs(reference, sample, TEMPERATURE)
        assert largest_gap(training, sample["training_log_probs"]) < FP32_GAP
    for step in range(1, STEPS + 1):
        assert largest_token_gap(original.samples(step)) > 100 * FP32_GAP, step


def test_a_rope_theta_and_a_re_tokenized_prompt_on_the_sglang_rollout_are_configuration_and_inputs(
    rope_and_token: LoopRun, reference, rope_reference
) -> None:
    samples = rope_and_token.samples()
    (changed,) = [s for s in samples if s["prompt_token_ids"] != s["rollout_prompt_token_ids"]]
    fed, written = changed["rollout_prompt_token_ids"][CHANGED_AT], changed["prompt_token_ids"][CHANGED_AT]
    whole = rope_and_token.diagnosis("report")  # every pair: the configuration differs too; inputs come first
    assert (whole["cause"], whole["module"]) == ("inputs", None), whole
    assert whole["evidence"][0] == (
        f"token ids differ from position {CHANGED_AT}: {fed} (rollout) vs {written} (training) "
        f"in request {changed['request_id']}"
    )
    others = rope_and_token.diagnosis("others", leave_out=(changed["request_id"],))
    assert (others["cause"], others["module"]) == ("configuration", None), others
    checkpoint = json.loads((Path(rope_and_token.summary["model"]) / "config.json").read_text())
    theta = checkpoint["rope_parameters"]["rope_theta"]
    assert [line for line in others["evidence"] if not line.startswith("not recorded")] == [
        f"rope_theta {ROPE_THETA} (rollout) vs {theta} (training)"
    ]
    # The oracle: SGLang's log-probs are transformers' with its rope theta on the prompt it was fed, training's on the
    # checkpoint and the prompt as written; the rope theta alone moves the other prompts by far more than fp32 noise.
    rollout = oracle_log_probs(rope_reference, changed, fed="rollout_prompt_token_ids")
    assert largest_gap(rollout, changed["rollout_log_probs"]) < FP32_GAP
    unchanged = [s for s in samples if s is not changed]
    for sample in unchanged:
        assert largest_gap(oracle_log_probs(rope_reference, sample), sample["rollout_log_probs"]) < FP32_GAP
        assert largest_gap(oracle_log_probs(reference, sample), sample["training_log_probs"]) < FP32_GAP
    assert largest_token_gap(unchanged) > 100 * FP32_GAP
