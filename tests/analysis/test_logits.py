"""The transforms the rollout's logits are checked through (``analysis/comparing/logits.py``): each side's log-probs
as vLLM makes them, on logits whose probabilities are known, so that a transform that keeps the wrong nucleus, applies
the temperature after it or normalises over the whole vocabulary gets other numbers. On real engines' logits:
``test_diagnosis.py`` (``logits_loop/``)."""

from __future__ import annotations

import math

import pytest
import torch

from msprobe_hooks.analysis.comparing.logits import Transform, claimed

PROBS = [0.05, 0.5, 0.15, 0.3]  # token 1 the likeliest; ascending: 0.05, 0.15, 0.3, 0.5
LOGITS = torch.tensor(PROBS).log()


def log_prob(transform: Transform, token: int) -> float:
    return transform.log_prob(LOGITS, token)


def test_no_transform_is_the_log_softmax_of_the_logits() -> None:
    assert [log_prob(Transform(), t) for t in range(4)] == pytest.approx([math.log(p) for p in PROBS])
    assert Transform().name == "log_softmax(logits)"


def test_the_temperature_divides_the_logits() -> None:
    tempered = torch.tensor(PROBS) ** (1 / 0.5)
    expected = (tempered / tempered.sum()).log().tolist()
    assert [log_prob(Transform(0.5), t) for t in range(4)] == pytest.approx(expected)
    assert Transform(0.5).name == "log_softmax(logits / 0.5)"


def test_top_p_keeps_the_smallest_set_of_that_mass_and_renormalises_over_it() -> None:
    # ascending cumulative mass 0.05, 0.2, 0.5, 1.0: everything up to 1 - 0.7 = 0.3 goes, 0.3 and 0.5 stay
    kept = Transform(top_p=0.7)
    assert log_prob(kept, 1) == pytest.approx(math.log(0.5 / 0.8))
    assert log_prob(kept, 3) == pytest.approx(math.log(0.3 / 0.8))
    assert log_prob(kept, 2) == log_prob(kept, 0) == -math.inf
    assert kept.name == "log_softmax(logits) over top-p 0.7"


def test_top_p_always_keeps_the_likeliest_token() -> None:
    assert log_prob(Transform(top_p=0.01), 1) == 0.0


def test_the_temperature_comes_before_the_nucleus() -> None:
    # at T = 2 the masses flatten to sqrt(p): ascending 0.120, 0.208, 0.294, 0.379 of their sum, cumulative 0.120,
    # 0.327, ...: with top-p 0.7 only token 0 goes, so token 2 stays (at T = 1 the same top-p drops it, above)
    tempered = torch.tensor(PROBS) ** 0.5
    expected = math.log(float(tempered[2] / tempered[1:].sum()))
    assert log_prob(Transform(2.0, top_p=0.7), 2) == pytest.approx(expected)
    assert log_prob(Transform(2.0, top_p=0.7), 0) == -math.inf


def test_top_k_and_min_p() -> None:
    assert log_prob(Transform(top_k=2), 3) == pytest.approx(math.log(0.3 / 0.8))
    assert log_prob(Transform(top_k=2), 2) == -math.inf
    # min-p 0.5: tokens of at least half the likeliest's probability (0.25): 0.5 and 0.3
    assert log_prob(Transform(min_p=0.5), 3) == pytest.approx(math.log(0.3 / 0.8))
    assert log_prob(Transform(min_p=0.5), 2) == -math.inf
    assert Transform(0.8, top_k=2, top_p=0.9, min_p=0.1).name == (
        "log_softmax(logits / 0.8) over min-p 0.1, top-k 2, top-p 0.9"
    )


def test_sampling_parameters_read_as_the_engines_hold_them() -> None:
    # vLLM's "off" values (top_k -1 or 0, top_p 1, min_p 0) and a greedy temperature are no transform at all
    assert Transform.of({"temperature": 0.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0}) == Transform()
    assert Transform.of({"temperature": 0.8, "top_k": 5, "top_p": 0.9}) == Transform(0.8, 5, 0.9)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("processed_logprobs", Transform(0.8, top_p=0.9)),  # vLLM: the distribution as sampled
        ("temperature_scaled_logprobs", Transform(0.8)),  # SGLang's default: the temperature, no nucleus
        ("raw_logprobs", Transform()),  # vLLM's default: the raw logits whatever the parameters
        (None, None),  # not recorded: nothing claimed
    ],
)
def test_what_a_mode_says_the_rollout_returns(mode, expected) -> None:
    assert claimed({"temperature": 0.8, "top_p": 0.9}, mode) == expected
