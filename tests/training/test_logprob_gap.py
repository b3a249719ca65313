"""The per-sample log-prob gap against verl's own definitions, on both trainer layouts of verl 0.9.1.

The engine's log-probs here are random (one per token of the packed micro-batch); what is checked
is where the gap reads them and how it reduces them. The expected values are computed with verl's
own functions: ``response_from_nested`` (v1) and ``no_padding_2_padding`` (v0) cut the response
log-probs out, as the trainers do before ``calculate_debug_metrics``, whose batch-level numbers the
per-sample ones must reproduce. The engine test (``test_verl_fsdp_gap.py``) checks the same on a real run.
"""

from __future__ import annotations

import json

import pytest
import torch
from support.logprob_gaps import GAP_FIELDS, TOKEN_FIELDS, assert_gap, expected_gap
from support.verl_batches import v0_engine_batch
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.utils.debug.metrics import calculate_debug_metrics
from verl.workers.utils.padding import no_padding_2_padding, response_from_nested

from cpu_kit import verl_cpu
from msprobe_hooks import config, join_keys
from msprobe_hooks.training import logprob_gap
from msprobe_hooks.training.micro_batch import describe_samples

THRESHOLD = 0.1


def _samples(response_lens: list[int]) -> list[verl_cpu.Sample]:
    gen = torch.Generator().manual_seed(7)
    samples = []
    for i, r in enumerate(response_lens):
        p = 3 + 2 * i
        ids = torch.randint(3, verl_cpu.VOCAB_SIZE, (p + r,), generator=gen).tolist()
        rollout = tuple((-2.0 + 0.3 * torch.randn(r, generator=gen)).tolist())
        samples.append(verl_cpu.Sample(tuple(ids[:p]), tuple(ids[p:]), f"u{i // 2}", i % 2, f"r{i}", rollout))
    return samples


def _log_probs(batch) -> torch.Tensor:
    """Engine-like output: one log-prob per token of the packed micro-batch, jagged as input_ids."""
    offsets = batch["input_ids"].offsets()
    values = -2.0 + 0.3 * torch.randn(int(offsets[-1]), generator=torch.Generator().manual_seed(11))
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def _expected(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> list[dict]:
    """verl's definitions per row of the padded (old, rollout, mask) verl's trainers hold."""
    return [expected_gap(o, r, m, THRESHOLD) for o, r, m in zip(old, rollout, mask, strict=True)]


def _assert_matches(gaps: list[logprob_gap.SampleGap], expected: list[dict]) -> None:
    assert len(gaps) == len(expected)
    for gap, want in zip(gaps, expected, strict=True):
        assert_gap(gap._asdict(), want)


def _batch_metrics(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, responses: torch.Tensor) -> dict:
    data = DataProto.from_dict(
        tensors={"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask, "responses": responses}
    )
    return calculate_debug_metrics(data)


def _assert_reproduces_verl(gaps: list[logprob_gap.SampleGap], metrics: dict) -> None:
    """verl's batch-level numbers from the per-sample ones: its max is their max, its mean their token-weighted mean."""
    counted = [g for g in gaps if g.tokens]
    assert max(g.probs_diff_max for g in counted) == pytest.approx(metrics["training/rollout_probs_diff_max"], rel=1e-6)
    weighted = sum(g.probs_diff_mean * g.tokens for g in counted) / sum(g.tokens for g in counted)
    assert weighted == pytest.approx(metrics["training/rollout_probs_diff_mean"], rel=1e-5)


def test_v1_jagged_rows_with_a_masked_token() -> None:
    samples = _samples([3, 5, 2, 4])
    batch = verl_cpu.make_batch(samples)
    assert batch["rollout_log_probs"].is_nested and batch["response_mask"].is_nested
    batch["response_mask"].values()[3 + 1] = 0  # sample 1's second response token: a tool token
    log_probs = _log_probs(batch)
    gaps = logprob_gap.statistics(log_probs, batch, describe_samples(batch), THRESHOLD)
    # What verl's v1 trainer does after the pass: the response log-probs, padded.
    old = response_from_nested(log_probs, batch["response_mask"]).to_padded_tensor(0.0)
    rollout = batch["rollout_log_probs"].to_padded_tensor(0.0)
    mask = batch["response_mask"].to_padded_tensor(0)
    expected = _expected(old, rollout, mask)
    _assert_matches(gaps, expected)
    assert [g.tokens for g in gaps] == [3, 4, 2, 4]
    _assert_reproduces_verl(gaps, _batch_metrics(old, rollout, mask, batch["responses"].to_padded_tensor(0)))


def test_v1_dense_rows_when_every_response_has_one_length() -> None:
    # verl's list_of_dict_to_tensordict stacks equal-length fields densely.
    samples = _samples([3, 3, 3])
    batch = verl_cpu.make_batch(samples)
    assert not batch["rollout_log_probs"].is_nested and not batch["response_mask"].is_nested
    log_probs = _log_probs(batch)
    rows = log_probs.unbind()
    old = torch.stack([row[len(s.prompt) - 1 : len(s.prompt) - 1 + 3] for row, s in zip(rows, samples, strict=True)])
    _assert_matches(
        logprob_gap.statistics(log_probs, batch, describe_samples(batch), THRESHOLD),
        _expected(old, batch["rollout_log_probs"], batch["response_mask"]),
    )


def test_v0_padded_rows_after_left_right_2_no_padding() -> None:
    samples = _samples([3, 5, 1, 4])
    batch = v0_engine_batch(samples)
    # v0: dense, right-padded to the batch's response width; the mask says where the responses end.
    assert tuple(batch["rollout_log_probs"].shape) == (4, 5) and not batch["response_mask"].is_nested
    batch["response_mask"][0, 2] = 0
    log_probs = _log_probs(batch)
    gaps = logprob_gap.statistics(log_probs, batch, describe_samples(batch), THRESHOLD)
    old = no_padding_2_padding(log_probs, batch)  # what RayPPOTrainer._compute_old_log_prob keeps
    expected = _expected(old, batch["rollout_log_probs"], batch["response_mask"])
    _assert_matches(gaps, expected)
    assert [g.tokens for g in gaps] == [2, 5, 1, 4]
    _assert_reproduces_verl(
        gaps, _batch_metrics(old, batch["rollout_log_probs"], batch["response_mask"], batch["responses"])
    )


def test_a_sample_with_no_counted_token_and_the_argmax_of_a_tie() -> None:
    samples = _samples([3, 4])
    batch = verl_cpu.make_batch(samples)
    batch["response_mask"].values()[:3] = 0  # sample 0: every response token masked
    log_probs = _log_probs(batch)
    # Sample 1's rollout log-probs make tokens 1 and 3 tie for the largest gap: the first one is named.
    p = len(samples[1].prompt)
    old = log_probs.unbind()[1][p - 1 : p + 3]
    rollout = batch["rollout_log_probs"].values()[3:]
    rollout[:] = old + torch.tensor([0.05, -0.5, 0.2, 0.5])
    gaps = logprob_gap.statistics(log_probs, batch, describe_samples(batch), THRESHOLD)
    assert gaps[0] == logprob_gap.SampleGap(0, None, None, None, 0, None, None)
    top = float((old - rollout).abs().max())
    assert gaps[1].argmax == 1 and gaps[1].max == top and gaps[1].over == 3


def test_rows_that_do_not_line_up_with_the_responses_are_refused() -> None:
    samples = _samples([3, 4])
    batch = verl_cpu.make_batch(samples)
    short = [torch.zeros(3), torch.zeros(3)]  # the second sample's response has 4 tokens
    batch["rollout_log_probs"] = torch.nested.as_nested_tensor(short, layout=torch.jagged)
    with pytest.raises(ValueError, match="rollout_log_probs has rows of \\[3, 3\\] tokens, the responses \\[3, 4\\]"):
        logprob_gap.statistics(_log_probs(batch), batch, describe_samples(batch), THRESHOLD)


def test_the_cpu_kit_puts_the_rollout_log_probs_in_the_v1_layout() -> None:
    samples = _samples([3, 4])
    with_rollout = verl_cpu.make_batch(samples)
    rows = with_rollout["rollout_log_probs"]
    assert rows.dtype == torch.float32 and [row.tolist() for row in rows.unbind()] == [
        pytest.approx(s.rollout_log_probs) for s in samples
    ]
    without = verl_cpu.make_batch([verl_cpu.Sample(s.prompt, s.response, s.uid) for s in samples])
    assert logprob_gap.has_rollout_log_probs(with_rollout) and not logprob_gap.has_rollout_log_probs(without)
    assert tu.get(without, "rollout_log_probs") is None


# --- what a line carries besides the gap: the temperature, and (MSPROBE_HOOKS_GAP_TOKENS) the tokens ----------


def _gap_lines(tmp_path, batch, log_probs, dumped: bool, **env: str) -> list[dict]:
    cfg = config.load({"DUMP_ON": "1", **env})
    log = logprob_gap.GapLog(lambda cfg: str(tmp_path))
    log.write(cfg, 0, batch, (torch.tensor(1.0), {"model_output": {"log_probs": log_probs}}), dumped)
    [path] = tmp_path.glob("*/logprob_gap.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_temperature_is_the_one_the_engine_reads_from_the_micro_batch() -> None:
    samples = _samples([3, 4, 2])
    scalar = verl_cpu.make_batch(samples, temperature=0.7)
    assert logprob_gap.temperatures(scalar, describe_samples(scalar)) == [0.7] * 3
    # One per sample, as verl's engines accept it (a tensor of the batch size).
    per_sample = verl_cpu.make_batch(samples, temperature=torch.tensor([0.5, 1.0, 0.25]))
    assert logprob_gap.temperatures(per_sample, describe_samples(per_sample)) == [0.5, 1.0, 0.25]
    without = verl_cpu.make_batch(samples)
    del without["temperature"]
    assert logprob_gap.temperatures(without, describe_samples(without)) == [None] * 3


@pytest.mark.parametrize("layout", ["v1", "v0"])
def test_the_token_ids_are_each_samples_whole_sequence_as_fed(layout) -> None:
    samples = _samples([3, 5, 1])
    batch = verl_cpu.make_batch(samples) if layout == "v1" else v0_engine_batch(samples)
    assert logprob_gap.token_ids(batch, describe_samples(batch)) == [list(s.prompt + s.response) for s in samples]


def test_kept_values_are_each_response_tokens_two_log_probs_rounded() -> None:
    samples = _samples([3, 5])
    batch = verl_cpu.make_batch(samples)
    log_probs = _log_probs(batch)
    gaps = logprob_gap.statistics(log_probs, batch, describe_samples(batch), THRESHOLD, keep_values=True)
    rollouts = batch["rollout_log_probs"].unbind()
    for gap, row, sample, rollout in zip(gaps, log_probs.unbind(), samples, rollouts, strict=True):
        p, r = len(sample.prompt), len(sample.response)
        assert gap.log_probs == pytest.approx(row[p - 1 : p - 1 + r].tolist(), abs=5e-7)
        assert gap.rollout_log_probs == pytest.approx(rollout.tolist(), abs=5e-7)
        assert all(v == round(v, join_keys.GAP_TOKEN_DECIMALS) for v in gap.log_probs)
    assert logprob_gap.statistics(log_probs, batch, describe_samples(batch), THRESHOLD)[0].log_probs is None


def test_which_lines_carry_the_tokens(tmp_path) -> None:
    samples = _samples([3, 4])
    batch = verl_cpu.make_batch(samples, temperature=0.8)
    log_probs = _log_probs(batch)

    def carried(name: str, dumped: bool, **env: str) -> list[bool]:
        lines = _gap_lines(tmp_path / name, batch, log_probs, dumped, **env)
        assert [line["temperature"] for line in lines] == [0.8, 0.8]
        assert all(list(line) in (GAP_FIELDS, GAP_FIELDS + TOKEN_FIELDS) for line in lines)
        return [list(line) == GAP_FIELDS + TOKEN_FIELDS for line in lines]

    # Default (dumped): the lines of a dumped pass, of the samples DUMP_REQUEST_IDS names.
    assert carried("undumped", False) == [False, False]
    assert carried("dumped", True) == [True, True]
    assert carried("chosen", True, DUMP_REQUEST_IDS=samples[1].request_id) == [False, True]
    assert carried("all", False, MSPROBE_HOOKS_GAP_TOKENS="all") == [True, True]
    assert carried("none", True, MSPROBE_HOOKS_GAP_TOKENS="none") == [False, False]
    line = _gap_lines(tmp_path / "values", batch, log_probs, True)[1]
    assert line["token_ids"] == list(samples[1].prompt + samples[1].response)
    assert len(line["log_probs"]) == len(line["rollout_log_probs"]) == 4
