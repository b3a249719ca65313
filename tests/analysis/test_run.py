"""A run of several global steps: pairs never join two of them, the run view, TensorBoard's scalars (golden trees).

The same prompts come back every global step (every epoch), so a prompt-hash join could pair step 2's
training forward with step 1's rollout; request ids are unique per rollout. The runs here are built
from the golden FSDP2 and vLLM trees (``support.golden.two_step_run``); the real loop is
``tests/inference/test_real_rl_loop.py``'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas
import pytest
from support import golden
from support.pages import assert_answer_first

from msprobe_hooks.analysis import results
from msprobe_hooks.analysis.pairing import pairs
from msprobe_hooks.cli import main


def align(train: Path, generate: Path, out: Path, capsys) -> tuple[int, list[pairs.Pair], str]:
    status = main(["align", str(train), str(generate), "-o", str(out)])
    printed = capsys.readouterr().out
    return status, list(pairs.read(str(out))) if out.exists() else [], printed


def rollout_round(pair: pairs.Pair, steps_per_round: int) -> int:
    return pair.generate.step // steps_per_round + 1


@pytest.mark.parametrize("ids", [True, False], ids=["by id", "by hash"])
def test_each_training_step_pairs_with_its_own_rollout_only(tmp_path, capsys, ids):
    train, generate = golden.two_step_run(tmp_path, ids=ids, times=True)
    status, found, printed = align(train, generate, tmp_path / "pairs.jsonl", capsys)
    assert status == 0, printed
    assert len(found) == 4  # 2 prompts x 2 global steps
    assert {p.rule for p in found} == {pairs.JoinRule.REQUEST_ID if ids else pairs.JoinRule.PROMPT_HASH}
    for pair in found:
        assert rollout_round(pair, 4) == pair.train.global_step, pair  # 4 vLLM steps per rollout
    assert sorted((p.train.global_step, p.key) for p in found)[0][0] == 1


def test_without_times_a_recurring_prompt_is_refused_not_guessed(tmp_path, capsys):
    train, generate = golden.two_step_run(tmp_path, ids=False, times=False)
    status, found, printed = align(train, generate, tmp_path / "pairs.jsonl", capsys)
    assert status == 1 and found == []
    assert results.Unpaired.AMBIGUOUS_HASH.value in printed


def test_a_join_whose_rollout_ran_in_another_step_is_refused_and_counted(tmp_path, capsys):
    """The training log of step 2 lost (a restart): its rollout's prompts find only step 1's dumps."""
    train, generate = golden.two_step_run(tmp_path, ids=False, times=True)
    (log,) = train.glob("*/update_actor_log.jsonl")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines if line["global_step"] == 1))
    log_with_three = log.read_text() + json.dumps({**lines[-1], "global_step": 3, "time": 400.0}) + "\n"
    log.write_text(log_with_three)  # step 3's dump, whose rollout is nowhere: step 2's must not stand in
    status, found, printed = align(train, generate, tmp_path / "pairs.jsonl", capsys)
    assert status == 0
    assert sorted(p.train.global_step for p in found) == [1, 1]
    assert results.Unpaired.OTHER_STEP.value in printed


@pytest.fixture
def two_steps_compared(tmp_path, capsys):
    train, generate = golden.two_step_run(tmp_path, ids=True, times=True)
    # step 2's rollout ran on weights that missed an update of layer 1's down_proj: its output is off
    for step in range(4, 8):
        for path in (generate / next(generate.iterdir()).name / f"step{step}").rglob("dump.json"):
            data = json.loads(path.read_text())
            for name, entry in data["data"].items():
                if ".layers.1.mlp.down_proj." in name:
                    for stat in ("Max", "Min", "Mean", "Norm"):
                        entry["output"][0][stat] *= 1.004  # a stale weight: far below the fixed 2e-2
            path.write_text(json.dumps(data))
    status, found, _ = align(train, generate, tmp_path / "pairs.jsonl", capsys)
    assert status == 0
    report, board = tmp_path / "report", tmp_path / "tb"
    status = main(
        ["compare", str(tmp_path / "pairs.jsonl"), "-o", str(report), "--jobs", "1", "--tensorboard", str(board)]
    )
    return status, capsys.readouterr().out, report, board


def test_the_run_view_names_the_first_diverging_step_and_its_module(two_steps_compared):
    status, printed, report, _ = two_steps_compared
    assert status == 0
    assert "run: global step 2 is the first to diverge, at layers.1.mlp.down_proj output" in printed
    assert "1 steps before it clean" in printed
    tidy = pandas.read_csv(report / "steps.csv")
    assert list(tidy.columns) == ["global_step", "scalar", "layer", "value"]
    first_layer = tidy[tidy["scalar"] == "first_divergent_layer"].set_index("global_step")["value"]
    assert first_layer.to_dict() == {1: -1.0, 2: 1.0}
    errors = tidy[(tidy["scalar"] == "layer_error") & (tidy["layer"] == 1)].set_index("global_step")["value"]
    assert errors[2] > 100 * errors[1]
    summary = (report / "summary.md").read_text()
    assert "## The run" in summary and "run_by_step.png" in summary
    assert_answer_first(report, printed)  # the run's verdict under the overall one, before the notes


def test_tensorboard_reads_back_the_scalars_per_global_step(two_steps_compared):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, _, _, board = two_steps_compared
    events = EventAccumulator(str(board))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {
        "msprobe_hooks/first_divergent_layer",
        "msprobe_hooks/largest_error",
        "msprobe_hooks/layer_error/L1",
    } <= tags
    first = {e.step: e.value for e in events.Scalars("msprobe_hooks/first_divergent_layer")}
    assert first == {1: -1.0, 2: 1.0}
    diverging = {e.step: e.value for e in events.Scalars("msprobe_hooks/diverging_pairs")}
    assert diverging == {1: 0.0, 2: 2.0}


def test_a_step_whose_dumps_are_missing_is_named_and_the_rest_reported(tmp_path, capsys):
    train, generate = golden.two_step_run(tmp_path, ids=True, times=True)
    for step in (2, 3):  # the training dumps of global step 2
        for path in (train / f"step{step}").rglob("dump.json"):
            path.unlink()
    status, found, printed = align(train, generate, tmp_path / "pairs.jsonl", capsys)
    assert status == 0 and sorted(p.train.global_step for p in found) == [1, 1]
    assert "dump unreadable" in printed
