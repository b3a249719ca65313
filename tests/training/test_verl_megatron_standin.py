"""The Megatron engine patch, driven through a stand-in of verl's Megatron engine module.

The stand-in (``tests/standins/megatron_transformer_impl.py``) is first checked against the
patch's contract; then ``tests/support/megatron_standin_child.py``, a fresh interpreter with the shim
active, imports it under the real module name, so activation, version gate, contract check and
patch run as they would on the real module, and real msprobe dumps its small torch chunks.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from support import REPO
from support.logprob_gaps import assert_gap, expected_gap
from support.megatron_standin import STANDIN, TARGET
from support.verl_runs import EngineRun, run_engine

from msprobe_hooks import contracts, join_keys
from msprobe_hooks.patches import PATCHES

CHILD = REPO / "tests" / "support" / "megatron_standin_child.py"
INSTALLED_VERL = "0.9.1"
FIRST_INPUT = "Functional.embedding.0.forward"  # the chunk's first op: its input is the token ids

PROMPT_LENS = [5, 7, 4, 6]
# Some responses outlast their prompt: a prompt-only micro-batch that kept the response's
# loss_mask would be longer than its input_ids, which verl's MTP loss-mask builder rejects.
RESPONSE_LENS = [9, 3]


def _patch_record():
    return next(p for p in PATCHES if p.name == "verl.megatron_engine")


def _run(tmp_path: Path, spec: dict, world_size: int = 1, **env: str) -> EngineRun:
    run = run_engine(tmp_path, spec, world_size=world_size, child=CHILD, **env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def _first_input_shape(run: EngineRun, step: int, rank: int = 0) -> list[int]:
    return run.dump(step, rank)[FIRST_INPUT]["input_args"][0]["shape"]


def test_standin_satisfies_the_contract_of_the_installed_version() -> None:
    facts = contracts.extract_facts(ast.parse(STANDIN.read_text()))
    items = [item for item in _patch_record().contract if contracts.applies(item, INSTALLED_VERL)]
    assert any(item.module == TARGET for item in items)
    for item in items:
        if item.module == TARGET:
            assert contracts.check_facts(item, facts) is None
        else:  # the rest of verl is the real, installed one
            assert contracts.check_facts(item, contracts.installed_facts(item.module)) is None


def test_actor_micro_batches_are_dumped_on_the_last_stage_only(tmp_path: Path) -> None:
    scenarios = [
        {"name": "actor.log_prob", "forward_only": True},
        {"name": "actor.update"},
        {"name": "ref.log_prob", "engine": {"forward_only": True}, "forward_only": True},
        {"name": "critic.update", "engine": {"value_head": True}},
        {"name": "middle_stage.update", "middle_stage": True},
        {"name": "vpp.update", "engine": {"chunks": 2}},
        {"name": "actor.log_prob_trimmed", "trimmed": True, "forward_only": True},
    ]
    run = _run(tmp_path, {"scenarios": scenarios}, DUMP_PHASE="all")
    report = run.reports[0]
    assert report["status"]["verl.megatron_engine"] == "applied"
    outcomes = report["outcomes"]
    assert {k: v for k, v in outcomes.items() if k != "vpp.update"} == {
        s["name"]: "ok" for s in scenarios if s["name"] != "vpp.update"
    }
    assert outcomes["vpp.update"].startswith("refused: DUMP_ON=1 with virtual pipeline parallelism (2 model chunks")
    lines = run.log_lines(0)
    # actor log-prob (2 micro-batches), actor update (2), trimmed log-prob (2); nothing for the ref
    # engine, the critic, a middle pipeline stage, or the refused virtual-pipeline run.
    assert [(line["step"], line["phase"], line["micro_batch"], line["dump"]) for line in lines] == [
        (0, "log_prob", 0, "micro_batch"),
        (1, "log_prob", 1, "micro_batch"),
        (2, "update_actor", 0, "micro_batch"),
        (3, "update_actor", 1, "micro_batch"),
        (4, "log_prob", 0, "micro_batch"),
        (5, "log_prob", 1, "micro_batch"),
    ]
    assert [s["uid"] for s in lines[0]["samples"]] == ["uid0", "uid0"]
    assert [s["prompt_len"] for s in lines[1]["samples"]] == [4, 6]
    assert run.steps(0) == [0, 1, 2, 3, 4, 5]
    for step in range(6):
        names = list(run.dump(step))
        # Every model chunk is bound: msprobe names modules by chunk index.
        assert any(name.startswith("Module.0.") for name in names)
        has_backward = any(".backward" in name for name in names)
        assert has_backward == (step in (2, 3)), f"step {step}: backward dumped={has_backward}"


PROMPTS_ONLY_SCENARIOS = [
    {"name": "actor.log_prob", "forward_only": True},
    {"name": "ref.log_prob", "engine": {"forward_only": True}, "forward_only": True},
    {"name": "actor.log_prob_with_grad", "forward_only": True, "grad": True},
    {"name": "actor.log_prob_bshd", "forward_only": True, "flags": {"forced_max_seqlen": 16}},
    {"name": "actor.update"},
    {"name": "router_replay.log_prob", "engine": {"router_replay": "R2"}, "forward_only": True},
    {"name": "dynamic_cp.log_prob", "engine": {"dynamic_context_parallel": True}, "forward_only": True},
    {"name": "pp2.log_prob", "engine": {"pipeline": 2}, "forward_only": True},
    {"name": "pp2.log_prob_trimmed", "engine": {"pipeline": 2}, "trimmed": True, "forward_only": True},
    {"name": "actor.log_prob_trimmed", "trimmed": True, "forward_only": True},
]
# Dumps per scenario, in order: a prompt each per sample, a micro-batch each per micro-batch.
PROMPTS_ONLY_DUMPS = {
    "actor.log_prob": 4,
    "actor.log_prob_with_grad": 4,
    "actor.log_prob_bshd": 4,
    "actor.update": 2,
    "pp2.log_prob_trimmed": 2,
    "actor.log_prob_trimmed": 2,
}


@pytest.fixture(scope="module")
def prompts_only_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[EngineRun, dict[str, list[dict]]]:
    spec = {"samples": {"count": 4, "prompt_lens": PROMPT_LENS, "response_lens": RESPONSE_LENS}}
    spec["scenarios"] = PROMPTS_ONLY_SCENARIOS
    run = _run(tmp_path_factory.mktemp("prompts_only"), spec, DUMP_PHASE="all", PROMPTS_ONLY="1")
    lines = run.log_lines(0)
    assert [line["step"] for line in lines] == run.steps(0) == list(range(sum(PROMPTS_ONLY_DUMPS.values())))
    by_scenario, start = {}, 0
    for name, count in PROMPTS_ONLY_DUMPS.items():
        by_scenario[name], start = lines[start : start + count], start + count
    return run, by_scenario


def _real_forward_lengths(micro_batch_size: int = 2) -> list[int]:
    totals = [p + RESPONSE_LENS[i % 2] for i, p in enumerate(PROMPT_LENS)]
    return [sum(totals[i : i + micro_batch_size]) for i in range(0, len(totals), micro_batch_size)]


def test_prompts_only_dumps_one_prompt_forward_per_sample_with_its_length(prompts_only_run) -> None:
    run, by_scenario = prompts_only_run
    for name in ("actor.log_prob", "actor.log_prob_with_grad", "actor.log_prob_bshd"):
        lines = by_scenario[name]
        assert [(line["phase"], line["micro_batch"], line["dump"]) for line in lines] == [
            ("log_prob", 0, "prompt"),
            ("log_prob", 0, "prompt"),
            ("log_prob", 1, "prompt"),
            ("log_prob", 1, "prompt"),
        ], name
        assert [[s["prompt_len"] for s in line["samples"]] for line in lines] == [[p] for p in PROMPT_LENS]
        assert [line["samples"][0]["uid"] for line in lines] == ["uid0", "uid0", "uid1", "uid1"]
        # The dump holds the prompt alone: its token ids are the chunk's first input. In the BSHD
        # scenario too, where the real forward pads to the mini-batch's longest (forced_max_seqlen).
        assert [_first_input_shape(run, line["step"]) for line in lines] == [[1, p] for p in PROMPT_LENS], name
    # Per micro-batch: one prompt-only forward per sample, then the real one on the whole micro-batch.
    real = _real_forward_lengths()
    expected = [[1, 5], [1, 7], [1, real[0]], [1, 4], [1, 6], [1, real[1]]]
    forwards = run.reports[0]["forwards"]
    assert [shape for shape, _ in forwards["actor.log_prob"]] == expected
    assert [shape for shape, _ in forwards["actor.log_prob_bshd"]] == [*expected[:2], [2, 16], *expected[3:5], [2, 16]]


def test_prompts_only_leaves_the_real_forward_unchanged(prompts_only_run) -> None:
    run, _ = prompts_only_run
    report = run.reports[0]
    assert report["outcomes"]["actor.log_prob"] == report["outcomes"]["ref.log_prob"] == "ok"
    # The ref engine is never dumped and has the same weights: the actor's real outputs match it exactly.
    assert report["outputs"]["actor.log_prob"] == report["outputs"]["ref.log_prob"]
    assert report["outputs"]["actor.log_prob_with_grad"] == report["outputs"]["ref.log_prob"]
    # The extra forwards run without autograd; the real forward keeps the grad mode it was called in.
    grad = [enabled for _, enabled in report["forwards"]["actor.log_prob_with_grad"]]
    assert grad == [False, False, True, False, False, True]
    # An update has no prompt-only forward: its micro-batches are dumped whole, with their backward.
    assert [shape for shape, _ in report["forwards"]["actor.update"]] == [[1, n] for n in _real_forward_lengths()]
    update = [line for line in run.log_lines(0) if line["phase"] == "update_actor"]
    assert [(line["micro_batch"], line["dump"]) for line in update] == [(0, "micro_batch"), (1, "micro_batch")]
    assert all(any(".backward" in name for name in run.dump(line["step"])) for line in update)


def test_prompts_only_is_refused_where_an_extra_forward_would_disturb_the_engine(prompts_only_run) -> None:
    run, _ = prompts_only_run
    outcomes, forwards = run.reports[0]["outcomes"], run.reports[0]["forwards"]
    assert outcomes["router_replay.log_prob"].startswith("refused: PROMPTS_ONLY=1 with router replay")
    assert outcomes["dynamic_cp.log_prob"].startswith("refused: PROMPTS_ONLY=1 with dynamic context parallelism")
    assert outcomes["pp2.log_prob"].startswith("refused: PROMPTS_ONLY=1 with pipeline parallel size 2")
    for message in (outcomes[name] for name in ("router_replay.log_prob", "dynamic_cp.log_prob", "pp2.log_prob")):
        assert "PROMPTS_ONLY=trim" in message
    # Refused before any work: no forward ran.
    assert forwards["router_replay.log_prob"] == forwards["dynamic_cp.log_prob"] == forwards["pp2.log_prob"] == []


def test_prompts_only_with_pipeline_parallelism_dumps_the_trimmed_batch(prompts_only_run) -> None:
    run, by_scenario = prompts_only_run
    report = run.reports[0]
    for name in ("pp2.log_prob_trimmed", "actor.log_prob_trimmed"):
        assert report["outcomes"][name] == "ok"
        lines = by_scenario[name]
        # No extra forward: the real forward of each micro-batch is the prompts' prefill, and it is dumped.
        assert [shape for shape, _ in report["forwards"][name]] == [[1, 12], [1, 10]]
        assert [(line["micro_batch"], line["dump"]) for line in lines] == [(0, "micro_batch"), (1, "micro_batch")]
        assert [[s["prompt_len"] for s in line["samples"]] for line in lines] == [[5, 7], [4, 6]]
        assert [_first_input_shape(run, line["step"]) for line in lines] == [[1, 12], [1, 10]]


def test_prompts_only_keeps_data_parallel_ranks_in_step(tmp_path: Path) -> None:
    # Rank 0 has micro-batches of 2 and 2 samples; rank 1 of 2 and 1, and its last sample is a
    # verl padding sample. Every forward of a real Megatron job may hold a collective across the
    # data-parallel ranks (expert-parallel all-to-all, Megatron FSDP's all-gathers).
    spec = {
        "samples": {"count": 8, "prompt_lens": PROMPT_LENS, "response_lens": [3, 4]},
        "keep": {"1": 3},
        "padding_on_rank": 1,
        "scenarios": [{"name": "actor.log_prob", "forward_only": True}],
    }
    run = _run(tmp_path, spec, world_size=2, DUMP_PHASE="log_prob", PROMPTS_ONLY="1")
    lines = {rank: run.log_lines(rank) for rank in (0, 1)}
    assert [(line["micro_batch"], line["samples"][0]["prompt_len"]) for line in lines[0]] == [
        (0, 5),
        (0, 7),
        (1, 4),
        (1, 6),
    ]
    # Rank 1's second micro-batch holds only the padding sample: forwarded, not dumped.
    assert [(line["micro_batch"], line["samples"][0]["prompt_len"]) for line in lines[1]] == [(0, 5), (0, 7)]
    forwards = {rank: [shape for shape, _ in run.reports[rank]["forwards"]["actor.log_prob"]] for rank in (0, 1)}
    assert len(forwards[0]) == len(forwards[1]) == 6
    # Rank 1 made up the missing sample by repeating its first one: the padding sample, 4 + 3 tokens.
    assert forwards[1][3:] == [[1, 4], [1, 4], [1, 7]]


def _gap_lines(run: EngineRun) -> list[dict]:
    paths = sorted(run.dump_root.glob(f"*/{join_keys.GAP_LOG}"))
    return [json.loads(line) for path in paths for line in path.read_text().splitlines()]


def test_the_log_prob_gap_is_written_from_the_postprocess_in_every_actor_log_prob_pass(tmp_path: Path) -> None:
    # DUMP_PHASE=update_actor: the log-prob pass is not dumped, its gap is logged all the same; the
    # update, the ref engine and a middle pipeline stage (no log-probs there) log none.
    scenarios = [
        {"name": "actor.log_prob", "forward_only": True},
        {"name": "actor.update"},
        {"name": "ref.log_prob", "engine": {"forward_only": True}, "forward_only": True},
        {"name": "middle_stage.log_prob", "middle_stage": True, "forward_only": True},
    ]
    samples = {"count": 4, "prompt_lens": PROMPT_LENS, "response_lens": RESPONSE_LENS, "rollout_log_probs": True}
    run = _run(tmp_path, {"samples": samples, "scenarios": scenarios}, DUMP_PHASE="update_actor")
    report = run.reports[0]
    assert set(report["outcomes"].values()) == {"ok"}
    assert report["outputs"]["actor.log_prob"] == report["outputs"]["ref.log_prob"]  # the forward untouched
    lines = _gap_lines(run)
    assert [(line["micro_batch"], line["sample"], line["uid"]) for line in lines] == [
        (0, 0, "uid0"),
        (0, 1, "uid0"),
        (1, 0, "uid1"),
        (1, 1, "uid1"),
    ]
    # Each micro-batch's log-probs, as the engine returned them: packed, the whole sequences.
    packed = report["outputs"]["actor.log_prob"]
    for line, i in zip(lines, range(4), strict=True):
        p, r = PROMPT_LENS[i], RESPONSE_LENS[i % 2]
        start = 0 if i % 2 == 0 else PROMPT_LENS[i - 1] + RESPONSE_LENS[0]
        old = packed[i // 2][start + p - 1 : start + p - 1 + r]
        assert_gap(line, expected_gap(old, [-2.0 - 0.1 * j for j in range(r)], [1] * r, 0.1))
        assert line["prompt_len"] == p and line["tokens"] == r


def test_whole_sequence_dumps_of_chosen_requests_and_where_they_are_refused(tmp_path: Path) -> None:
    scenarios = [
        {"name": "actor.log_prob", "forward_only": True},
        {"name": "pp2.log_prob", "engine": {"pipeline": 2}, "forward_only": True},
        {"name": "router_replay.log_prob", "engine": {"router_replay": "R2"}, "forward_only": True},
    ]
    samples = {"count": 4, "prompt_lens": PROMPT_LENS, "response_lens": RESPONSE_LENS, "rollout_log_probs": True}
    env = {"DUMP_PHASE": "log_prob", "DUMP_SEQUENCES": "1", "DUMP_REQUEST_IDS": "req-uid-1,req-uid-3"}
    run = _run(tmp_path, {"samples": samples, "scenarios": scenarios}, **env)
    outcomes, forwards = run.reports[0]["outcomes"], run.reports[0]["forwards"]
    assert outcomes["actor.log_prob"] == "ok"
    assert outcomes["pp2.log_prob"].startswith("refused: DUMP_SEQUENCES=1 with pipeline parallel size 2")
    assert outcomes["router_replay.log_prob"].startswith("refused: DUMP_SEQUENCES=1 with router replay")
    assert forwards["pp2.log_prob"] == forwards["router_replay.log_prob"] == []
    lines = run.log_lines(0)
    totals = [p + RESPONSE_LENS[i % 2] for i, p in enumerate(PROMPT_LENS)]
    assert [(line["micro_batch"], line["dump"], line["request_ids"]) for line in lines] == [
        (0, "sequence", ["req-uid-1"]),
        (1, "sequence", ["req-uid-3"]),
    ]
    assert [_first_input_shape(run, line["step"]) for line in lines] == [[1, totals[1]], [1, totals[3]]]
    # Both samples of each micro-batch get their forward (the other undumped), then the real one.
    real = _real_forward_lengths()
    assert [shape for shape, _ in forwards["actor.log_prob"]] == [
        [1, totals[0]],
        [1, totals[1]],
        [1, real[0]],
        [1, totals[2]],
        [1, totals[3]],
        [1, real[1]],
    ]
    assert len(_gap_lines(run)) == 4  # not filtered
