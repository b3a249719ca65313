"""``make demo-causes`` (``examples/demo_causes.sh``) as the Makefile runs it: two real causes, no weight touched.

One global step of the CPU kit's RL loop per act, vLLM's CPU engine rolling out for verl's FSDP2 engine, fp32 on
both sides, the hooks on from the environment: (1) the rollout samples at temperature 0.8 with vLLM's
``processed_logprobs`` while the trainer is given 1.0: ``sampling``, after the logits; (2) vLLM's KV cache in
``fp8_e4m3``: ``precision`` at layer 0's attention core, on the prefill path. Each act's ``diagnosis.json`` is
checked for its cause, path and evidence, and each gap against an oracle independent of the tool and of both
engines: Hugging Face transformers' own forward of the same tokens on the same checkpoint. The healthy loop's gap
(fp32 noise, ``FP32_GAP``) is checked by ``test_real_rl_loop.py``; here training's log-probs must sit at that noise
from the oracle while the rollout's are far from it.

Three more kinds, in two more runs of the loop (each ~85 s here; not acts of the demo, which stays two causes), each
cause put on the rollout engine only, through what vLLM itself offers: ``hf_overrides={"head_dtype": "bfloat16"}``
(its logits in bf16: ``precision`` after the logits); ``hf_overrides={"rope_parameters": ...}`` with another rope
theta (``configuration``) in the same run as one prompt fed to the rollout with one token changed under its own
request id (``inputs``). A diagnosis answers for the pairs its report is given: the whole run's report (every pair)
must say ``inputs`` (the rules' order: inputs first, everything downstream inherits them), the report of the three
other prompts' pairs ``configuration``. Four vLLM engine starts in all (~20-70 s each on 2 cores).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from support.rl_loop import (
    FP32_GAP,
    TENSOR_ENV,
    LoopRun,
    largest_gap,
    oracle_log_probs,
    reference_model,
    run_demo,
    run_loop,
)
from support.verl_runs import HANG_LIMIT_S

from cpu_kit.rl_loop import token_gaps

pytestmark = pytest.mark.engine  # runs a real engine (make test-fast leaves it out)

ROLLOUT_TEMPERATURE, TRAIN_TEMPERATURE = 0.8, 1.0  # demo_causes.sh's act 1


@dataclass
class Demo:
    out: Path  # demo_causes.sh's output folder
    printed: str  # what it printed on the terminal

    def diagnosis(self, act: str) -> dict:
        return json.loads((self.out / act / "report" / "diagnosis.json").read_text())

    def samples(self, act: str) -> list[dict]:
        (step,) = json.loads((self.out / act / "out" / "summary.json").read_text())["steps"]
        return step["samples"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    out = tmp_path_factory.mktemp("demo-causes") / "out"
    return Demo(out, run_demo("demo_causes.sh", out, 2 * HANG_LIMIT_S))


@pytest.fixture(scope="module")
def reference(demo: Demo) -> torch.nn.Module:
    """The demo's checkpoint in transformers, fp32: the oracle's model."""
    return reference_model(demo.out / "inputs" / "model")


def token_gap(samples: list[dict]) -> float:
    """The largest |training - rollout| log-prob over the samples' response tokens (summary.json's)."""
    return max(max(token_gaps(sample)) for sample in samples)


def test_each_act_is_answered_in_one_line(demo: Demo) -> None:
    lines = [line for line in demo.printed.splitlines() if line.startswith("cause: ")]
    assert [line.split(":", 2)[:2] for line in lines] == [
        ["cause", " sampling (after the logits)"],
        ["cause", " precision (prefill)"],
    ], demo.printed[-3000:]


def test_the_pairs_name_what_each_side_recorded(demo: Demo) -> None:
    for act in ("sampling", "kv_fp8"):
        for line in (demo.out / act / "pairs.jsonl").read_text().splitlines():
            pair = json.loads(line)
            named = [pair["train"]["engine_log"], pair["generate"]["engine_log"], pair["generate"]["requests_log"]]
            assert all((demo.out / act / path).is_file() for path in named), (act, named)


def test_the_rollouts_temperature_never_given_to_the_trainer_is_sampling(demo: Demo, reference) -> None:
    diagnosis = demo.diagnosis("sampling")
    assert (diagnosis["cause"], diagnosis["path"], diagnosis["module"]) == ("sampling", "after the logits", None)
    evidence = "\n".join(diagnosis["evidence"])
    assert f"temperature {ROLLOUT_TEMPERATURE} (rollout) vs {TRAIN_TEMPERATURE} (training)" in evidence
    assert "processed_logprobs" in evidence
    # Dumped in tensor mode: each side's log-probs read from the rollout's own logits at its sampling steps, every
    # response token (its prefill's and each decode step's)
    tokens = sum(len(sample["rollout_log_probs"]) for sample in demo.samples("sampling"))
    assert f"the rollout's log-probs equal log_softmax(logits / {ROLLOUT_TEMPERATURE:g}) " in evidence
    assert "training's recomputed log-probs equal log_softmax(logits) " in evidence
    assert f"on all {tokens} response tokens checked" in evidence, evidence
    assert "the same logits made into log-probs two ways" in evidence
    printed = [line.strip() for line in demo.printed.splitlines() if "log-probs equal" in line]
    assert printed and printed[0].startswith("the rollout's log-probs equal log_softmax(logits / 0.8)"), printed
    # The oracle: the rollout's log-probs are of logits / 0.8, training's of the logits, each to fp32 noise.
    for sample in demo.samples("sampling"):
        rollout = oracle_log_probs(reference, sample, ROLLOUT_TEMPERATURE)
        training = oracle_log_probs(reference, sample, TRAIN_TEMPERATURE)
        assert largest_gap(rollout, sample["rollout_log_probs"]) < FP32_GAP
        assert largest_gap(training, sample["training_log_probs"]) < FP32_GAP
    assert token_gap(demo.samples("sampling")) > 100 * FP32_GAP


def test_an_fp8_kv_cache_in_the_rollout_is_precision_at_the_attention_core(demo: Demo, reference) -> None:
    diagnosis = demo.diagnosis("kv_fp8")
    assert (diagnosis["cause"], diagnosis["path"], diagnosis["global_step"]) == ("precision", "prefill", 1)
    # the attention core's output (o_proj's input is the same tensor) in layer 0, the first to read the cache
    assert diagnosis["module"] in ("layers.0.self_attn.attn", "layers.0.self_attn.o_proj"), diagnosis
    assert diagnosis["evidence"][0].startswith("KV cache fp8_e4m3 (rollout"), diagnosis["evidence"]
    # The oracle: training's log-probs are transformers' to fp32 noise; the rollout's are far from them.
    for sample in demo.samples("kv_fp8"):
        training = oracle_log_probs(reference, sample, TRAIN_TEMPERATURE)
        assert largest_gap(training, sample["training_log_probs"]) < FP32_GAP
    assert token_gap(demo.samples("kv_fp8")) > 100 * FP32_GAP


# --- three more kinds, two more runs: the rollout engine's own hf_overrides, and a prompt re-tokenized -------------

HEAD_DTYPE = "bfloat16"  # the rollout's logits (vLLM's head_dtype); the model and training stay fp32
ROPE_THETA = 500000.0  # the rollout's rope theta (the checkpoint's is 10000)
CHANGED_AT = 2  # the position of the first prompt's token the rollout is fed changed
# The rollout's bf16 logits against the oracle's (the same casts, from fp32 hidden states that differ at fp32 noise,
# so a bf16 rounding may fall the other way): measured 6.7e-6, against 9.4e-4..2.9e-3 from the fp32 logits.
BF16_HEAD_GAP = 10 * FP32_GAP


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory, demo: Demo) -> LoopRun:
    overrides = json.dumps({"head_dtype": HEAD_DTYPE})
    work = tmp_path_factory.mktemp("head-dtype")  # in tensor mode: the rollout's bf16 logits read back
    return run_loop(work, demo.out / "inputs", "--iterations", "1", "--rollout-hf-overrides", overrides, **TENSOR_ENV)


@pytest.fixture(scope="module")
def rope_and_token(tmp_path_factory: pytest.TempPathFactory, demo: Demo) -> LoopRun:
    overrides = json.dumps({"rope_parameters": {"rope_theta": ROPE_THETA, "rope_type": "default"}})
    args = ["--iterations", "1", "--rollout-hf-overrides", overrides, "--rollout-token-change", str(CHANGED_AT)]
    return run_loop(tmp_path_factory.mktemp("rope-and-token"), demo.out / "inputs", *args)


@pytest.fixture(scope="module")
def rope_reference(demo: Demo) -> torch.nn.Module:
    """The checkpoint in transformers with the rollout's rope theta: the oracle of the rollout's configuration."""
    from transformers import AutoConfig

    model = demo.out / "inputs" / "model"
    config = AutoConfig.from_pretrained(model)
    config.rope_parameters = {**config.rope_parameters, "rope_theta": ROPE_THETA}
    return reference_model(model, config=config)


def test_the_rollouts_logits_in_bf16_are_precision_after_the_logits(head: LoopRun, reference) -> None:
    diagnosis = head.diagnosis("report")
    assert (diagnosis["cause"], diagnosis["path"], diagnosis["module"]) == ("precision", "after the logits", "lm_head")
    assert diagnosis["evidence"][0].startswith(f"lm_head output {HEAD_DTYPE} (rollout) vs float32 (training)")
    assert diagnosis["evidence"][1].startswith("every error within the float32 floor"), diagnosis["evidence"]
    # The rollout's own bf16 logits: its log-probs are theirs; training's are off them beyond the fp32 noise
    evidence = "\n".join(diagnosis["evidence"])
    assert "the rollout's log-probs equal log_softmax(logits) to " in evidence
    assert f"(its own logits, {HEAD_DTYPE}, from its dumped sampling steps)" in evidence
    assert "training's recomputed log-probs are off log_softmax(logits) of the rollout's logits by up to" in evidence
    # The oracle: the rollout's log-probs are of the fp32 model's hidden states through a bf16 lm_head, training's of
    # the fp32 lm_head; the two apart by far more than either is from its oracle.
    for sample in head.samples():
        rollout = oracle_log_probs(reference, sample, head_dtype=getattr(torch, HEAD_DTYPE))
        assert largest_gap(rollout, sample["rollout_log_probs"]) < BF16_HEAD_GAP
        assert largest_gap(oracle_log_probs(reference, sample), sample["training_log_probs"]) < FP32_GAP
    assert token_gap(head.samples()) > 100 * FP32_GAP


def test_a_prompt_fed_otherwise_under_its_request_id_is_inputs(rope_and_token: LoopRun, reference, rope_reference):
    changed = next(s for s in rope_and_token.samples() if s["prompt_token_ids"] != s["rollout_prompt_token_ids"])
    fed, written = changed["rollout_prompt_token_ids"][CHANGED_AT], changed["prompt_token_ids"][CHANGED_AT]
    diagnosis = rope_and_token.diagnosis("report")  # every pair: the configuration differs too; inputs come first
    assert (diagnosis["cause"], diagnosis["path"], diagnosis["module"]) == ("inputs", None, None)
    assert diagnosis["evidence"][0] == (
        f"token ids differ from position {CHANGED_AT}: {fed} (rollout) vs {written} (training) "
        f"in request {changed['request_id']}"
    )
    assert len([line for line in diagnosis["evidence"] if line.startswith("token ids differ")]) == 1
    # The oracle: the rollout's log-probs are transformers' on the prompt it was fed (with its rope theta), training's
    # on the prompt as written; apart by far more than the rope theta alone moves the other prompts.
    rollout = oracle_log_probs(rope_reference, changed, fed="rollout_prompt_token_ids")
    assert largest_gap(rollout, changed["rollout_log_probs"]) < FP32_GAP
    assert largest_gap(oracle_log_probs(reference, changed), changed["training_log_probs"]) < FP32_GAP
    others = [s for s in rope_and_token.samples() if s is not changed]
    assert token_gap([changed]) > 10 * token_gap(others)


def test_the_rollouts_rope_theta_override_is_configuration(rope_and_token: LoopRun, reference, rope_reference):
    changed = [
        s["request_id"] for s in rope_and_token.samples() if s["prompt_token_ids"] != s["rollout_prompt_token_ids"]
    ]
    diagnosis = rope_and_token.diagnosis("others", leave_out=tuple(changed))
    assert (diagnosis["cause"], diagnosis["path"], diagnosis["module"]) == ("configuration", None, None)
    checkpoint = json.loads((Path(rope_and_token.summary["model"]) / "config.json").read_text())
    decided = [line for line in diagnosis["evidence"] if not line.startswith("not recorded")]
    assert decided == [f"rope_theta {ROPE_THETA} (rollout) vs {checkpoint['rope_parameters']['rope_theta']} (training)"]
    # The oracle: the rollout's log-probs are transformers' with the rollout's rope theta, training's with the
    # checkpoint's, each to fp32 noise, and far from each other.
    samples = [s for s in rope_and_token.samples() if s["request_id"] not in changed]
    for sample in samples:
        assert largest_gap(oracle_log_probs(rope_reference, sample), sample["rollout_log_probs"]) < FP32_GAP
        assert largest_gap(oracle_log_probs(reference, sample), sample["training_log_probs"]) < FP32_GAP
    assert token_gap(samples) > 100 * FP32_GAP
