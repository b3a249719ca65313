"""PROMPTS_ONLY trim through verl's real v0 trainer code (in-process activation, stand-in actor workers).

``RayPPOTrainer._compute_old_log_prob`` runs for real: the DataProto is converted by verl for the
actor worker group (a stand-in recording what the actor engine would receive) and the log-probs are
converted back. The early returns are checked on verl's real functions, as ``fit`` calls them.
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np
import pytest
from support import STANDINS
from support.verl_batches import PROMPTS, RESPONSE_WIDTH, RESPONSES, v0_batch

from msprobe_hooks.patching import TargetChanged, is_ours, wrap_method
from msprobe_hooks.training import prompts_only

sys.path.insert(0, str(STANDINS / "verl_standins"))

from verl.trainer.ppo import rollout_corr_helper  # noqa: E402
from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: E402
from verl.utils.debug import metrics  # noqa: E402
from verl_standins import ActorWorkerGroup, activated, job_config  # noqa: E402

ROLLOUT_CORRECTION = {"rollout_is": "token", "rollout_is_threshold": 2.0}


def _trainer(**overrides: object) -> RayPPOTrainer:
    trainer = object.__new__(RayPPOTrainer)  # the real class; fit() and its workers are not needed
    trainer.config = job_config("unused-model-path", **overrides)
    trainer.actor_rollout_wg = ActorWorkerGroup()
    return trainer


def _step(trainer: RayPPOTrainer) -> tuple:
    """What fit() does from old_log_prob up to the rollout correction, on a fresh batch."""
    batch, _ = v0_batch(mrope=False)
    old_log_prob, _ = trainer._compute_old_log_prob(batch)
    old_log_prob.batch.pop("entropys")
    batch = batch.union(old_log_prob)
    debug_metrics = metrics.calculate_debug_metrics(batch)
    corrected, correction_metrics = rollout_corr_helper.compute_rollout_correction_and_add_to_batch(
        batch, ROLLOUT_CORRECTION
    )
    return batch, trainer.actor_rollout_wg.seen[0], debug_metrics, corrected, correction_metrics


@pytest.mark.parametrize(
    ("env", "overrides"),
    [
        ({"PROMPTS_ONLY": "trim"}, {}),
        (
            {"PROMPTS_ONLY": "1"},
            {
                "actor_rollout_ref.actor.strategy": "megatron",
                "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": 2,
            },
        ),
    ],
    ids=["trim", "forward-impossible-with-megatron-pp2"],
)
def test_trim_cuts_the_batch_before_old_log_prob_and_the_metrics_return_early(env, overrides):
    with activated(**env):
        batch, actor_input, debug_metrics, corrected, correction_metrics = _step(_trainer(**overrides))
    assert actor_input["input_ids"] == PROMPTS
    assert batch.batch["old_log_probs"].shape == (2, 0)
    assert batch.batch["responses"].shape == (2, 0)
    assert debug_metrics == prompts_only.SKIPPED_DEBUG_METRICS
    assert corrected is batch and correction_metrics == {}


@pytest.mark.parametrize("raw", ["0", "1"])
def test_without_trim_the_batch_and_the_metrics_are_verls_own(raw):
    with activated(PROMPTS_ONLY=raw):
        batch, actor_input, debug_metrics, corrected, correction_metrics = _step(_trainer())
    assert actor_input["input_ids"] == [p + r for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    assert batch.batch["old_log_probs"].shape == (2, RESPONSE_WIDTH)
    assert debug_metrics["training/rollout_probs_diff_valid"] == 1
    assert correction_metrics  # computed by verl
    assert "rollout_is_weights" in corrected.batch


@pytest.mark.parametrize("dump_on", [True, False])
def test_the_actor_sees_the_trainers_global_step_not_the_rollouts(dump_on):
    """verl's v0 trainer stamps no step before the log-prob pass; the per-sample ``global_steps`` is the rollout's
    weights' version, the step before. With the hooks on, the actor sees the trainer's, and the batch is as it was."""
    trainer = _trainer()
    trainer.global_steps = 7
    batch, _ = v0_batch(mrope=False)
    batch.non_tensor_batch["global_steps"] = np.full(len(batch), 6, dtype=object)
    meta_before = dict(batch.meta_info)
    with activated(PROMPTS_ONLY="1") if dump_on else contextlib.nullcontext():
        trainer._compute_old_log_prob(batch)
    assert trainer.actor_rollout_wg.seen[0]["global_step"] == (7 if dump_on else 6)
    assert batch.meta_info == meta_before


def test_bypass_mode_has_no_old_log_prob_forward_and_is_not_trimmed():
    with activated(PROMPTS_ONLY="trim"):
        trainer = _trainer(**{"algorithm.rollout_correction.bypass_mode": True})
        batch, _ = v0_batch(mrope=False)
        trainer._compute_old_log_prob(batch)
        assert not prompts_only.batch_trimmed()
    assert batch.batch["responses"].shape == (2, RESPONSE_WIDTH)


def test_a_trim_that_fails_leaves_the_batch_whole_and_training_on(monkeypatch):
    def unexpected_layout(batch: object) -> None:
        raise ValueError("a layout the trim does not know")

    monkeypatch.setattr(prompts_only, "trim_padded", unexpected_layout)
    with activated(PROMPTS_ONLY="trim"):
        trainer = _trainer()
        batch, _ = v0_batch(mrope=False)
        old_log_prob, _ = trainer._compute_old_log_prob(batch)
        assert not prompts_only.batch_trimmed()
    assert trainer.actor_rollout_wg.seen[0]["input_ids"] == [p + r for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    assert old_log_prob.batch["old_log_probs"].shape == (2, RESPONSE_WIDTH)


def test_unpatched_after_deactivation():
    with activated(PROMPTS_ONLY="trim"):
        assert is_ours(metrics.calculate_debug_metrics, "verl.trim_debug_metrics")
    assert not is_ours(metrics.calculate_debug_metrics, "verl.trim_debug_metrics")
    batch, actor_input, _, _, _ = _step(_trainer())
    assert batch.batch["responses"].shape == (2, RESPONSE_WIDTH)
    assert actor_input["input_ids"][0] == PROMPTS[0] + RESPONSES[0]


def test_wrapping_a_missing_module_function_is_a_target_change():
    with pytest.raises(TargetChanged, match=r"verl\.utils\.debug\.metrics\.no_such_function"):
        wrap_method(metrics, "no_such_function", lambda *args: None, "test")
