"""``make demo-causes`` (``examples/demo_causes.sh``) as the Makefile runs it: two real causes, no weight touched.

One global step of the CPU kit's RL loop per act, vLLM's CPU engine rolling out for verl's FSDP2 engine, fp32 on
both sides, the hooks on from the environment: (1) the rollout samples at temperature 0.8 with vLLM's
``processed_logprobs`` while the trainer is given 1.0: ``sampling``, after the logits; (2) vLLM's KV cache in
``fp8_e4m3``: ``precision`` at layer 0's attention core, on the prefill path. Each act's ``diagnosis.json`` is
checked for its cause, path and evidence, and each gap against an oracle independent of the tool and of both
engines: Hugging Face transformers' own forward of the same tokens on the same checkpoint. The healthy loop's gap
(fp32 noise, ``FP32_GAP``) is checked by ``test_real_rl_loop.py``; here training's log-probs must sit at that noise
from the oracle while the rollout's are far from it. Two vLLM engine starts (~20-70 s each on 2 cores).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from support.rl_loop import FP32_GAP, run_demo

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
    return Demo(out, run_demo("demo_causes.sh", out, hang_limits=2))


@pytest.fixture(scope="module")
def reference(demo: Demo) -> torch.nn.Module:
    """The demo's checkpoint in transformers, fp32: the oracle's model."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(demo.out / "inputs" / "model", dtype=torch.float32).eval()


def oracle_log_probs(model: torch.nn.Module, sample: dict, temperature: float) -> torch.Tensor:
    """log_softmax(logits / temperature) of the sample's response tokens, by transformers' forward of its ids."""
    prompt, response = sample["prompt_token_ids"], sample["response_token_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(response)]
    return torch.log_softmax(logits / temperature, dim=-1).gather(1, torch.tensor(response)[:, None])[:, 0]


def largest_gap(values: torch.Tensor, logged: list[float]) -> float:
    return float((values - torch.tensor(logged)).abs().max())


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
