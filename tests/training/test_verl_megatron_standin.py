"""The Megatron engine patch where verl's real Megatron engine cannot take it on this CPU: a stand-in.

``test_real_megatron.py`` runs the real engine (BSHD, the local layer spec, one model per rank).
What it cannot reach is driven here through the stand-in
``tests/standins/megatron_transformer_impl.py``: THD-packed micro-batches (the local spec has no
packed attention), a log-prob pass called with grad enabled (verl's ``infer_batch`` never is), a
batch already trimmed at pipeline parallel size 1, the refusals of router replay (no MoE model
here), dynamic context parallelism (needs DPxCP >= 2 with THD) and an untrimmed batch under pipeline
parallelism (on the real engine the refusal stops the job, a two-process run of its own), and
data-parallel ranks of unequal sample counts. The stand-in is first checked against the patch's contract;
then ``tests/support/megatron_standin_child.py``, a fresh interpreter with the shim active, imports
it under the real module name, so activation, version gate, contract check and patch run as they
would on the real module, and real msprobe dumps its small torch chunks.
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

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

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


PROMPTS_ONLY_SCENARIOS = [
    {"name": "actor.log_prob"},
    {"name": "ref.log_prob", "engine": {"forward_only": True}},
    {"name": "actor.log_prob_with_grad", "grad": True},
    {"name": "router_replay.log_prob", "engine": {"router_replay": "R2"}},
    {"name": "dynamic_cp.log_prob", "engine": {"dynamic_context_parallel": True}},
    {"name": "pp2.log_prob", "engine": {"pipeline": 2}},
    {"name": "actor.log_prob_trimmed", "trimmed": True},
]
# Dumps per scenario, in order: a prompt each per sample, a micro-batch each per micro-batch.
PROMPTS_ONLY_DUMPS = {"actor.log_prob": 4, "actor.log_prob_with_grad": 4, "actor.log_prob_trimmed": 2}


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


def test_prompts_only_dumps_one_prompt_forward_per_sample_of_a_packed_micro_batch(prompts_only_run) -> None:
    run, by_scenario = prompts_only_run
    for name in ("actor.log_prob", "actor.log_prob_with_grad"):
        lines = by_scenario[name]
        assert [(line["phase"], line["micro_batch"], line["dump"]) for line in lines] == [
            ("log_prob", 0, "prompt"),
            ("log_prob", 0, "prompt"),
            ("log_prob", 1, "prompt"),
            ("log_prob", 1, "prompt"),
        ], name
        assert [[s["prompt_len"] for s in line["samples"]] for line in lines] == [[p] for p in PROMPT_LENS]
        assert [line["samples"][0]["uid"] for line in lines] == ["uid0", "uid0", "uid1", "uid1"]
        # The dump holds the prompt alone: its token ids are the chunk's first input.
        assert [_first_input_shape(run, line["step"]) for line in lines] == [[1, p] for p in PROMPT_LENS], name
    # Per micro-batch: one prompt-only forward per sample, then the real one on the whole micro-batch, packed.
    real = _real_forward_lengths()
    expected = [[1, 5], [1, 7], [1, real[0]], [1, 4], [1, 6], [1, real[1]]]
    assert [shape for shape, _ in run.reports[0]["forwards"]["actor.log_prob"]] == expected


def test_prompts_only_leaves_the_real_forward_and_its_grad_mode_unchanged(prompts_only_run) -> None:
    run, _ = prompts_only_run
    report = run.reports[0]
    assert report["outcomes"]["actor.log_prob"] == report["outcomes"]["ref.log_prob"] == "ok"
    # The ref engine is never dumped and has the same weights: the actor's real outputs match it exactly.
    assert report["outputs"]["actor.log_prob"] == report["outputs"]["ref.log_prob"]
    assert report["outputs"]["actor.log_prob_with_grad"] == report["outputs"]["ref.log_prob"]
    # The extra forwards run without autograd; the real forward keeps the grad mode it was called in.
    grad = [enabled for _, enabled in report["forwards"]["actor.log_prob_with_grad"]]
    assert grad == [False, False, True, False, False, True]


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


def test_prompts_only_dumps_an_already_trimmed_batch_whole(prompts_only_run) -> None:
    run, by_scenario = prompts_only_run
    report = run.reports[0]
    assert report["outcomes"]["actor.log_prob_trimmed"] == "ok"
    lines = by_scenario["actor.log_prob_trimmed"]
    # No extra forward: the real forward of each micro-batch is the prompts' prefill, and it is dumped.
    assert [shape for shape, _ in report["forwards"]["actor.log_prob_trimmed"]] == [[1, 12], [1, 10]]
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
        "scenarios": [{"name": "actor.log_prob"}],
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
        {"name": "actor.log_prob"},
        {"name": "actor.update", "forward_only": False},
        {"name": "ref.log_prob", "engine": {"forward_only": True}},
        {"name": "middle_stage.log_prob", "middle_stage": True},
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
        {"name": "actor.log_prob"},
        {"name": "pp2.log_prob", "engine": {"pipeline": 2}},
        {"name": "router_replay.log_prob", "engine": {"router_replay": "R2"}},
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
