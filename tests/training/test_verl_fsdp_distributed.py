"""Training-side dumps at world size 2 (torchrun, gloo) on verl 0.9.1's real FSDP2 engine.

FSDP all-gathers parameters in every forward, so every rank must run the same number of
forwards: a prompt-only extra forward on one rank but not the other hangs the job. A hang makes
the child exceed ``verl_runs.HANG_LIMIT_S`` and the test fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.verl_runs import run_engine

from cpu_kit import verl_cpu
from msprobe_hooks import join_keys

pytestmark = pytest.mark.engine  # runs a real engine (make test-fast leaves it out)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return verl_cpu.build_model_dir(str(tmp_path_factory.mktemp("model")))


def test_prompts_only_with_dynamic_batches_and_padding_keeps_ranks_in_step(tmp_path: Path, model_dir: str) -> None:
    # Rank 0 gets one long and three short prompts, rank 1 four medium ones: verl's dynamic batching
    # (token budget 40) makes micro-batches of different sizes on the two ranks. Rank 1's last
    # sample is a verl padding sample.
    prompt_lens = [30, 3, 3, 3, 12, 12, 12, 12]
    spec = {
        "ops": ["actor.log_prob"],
        "count": 8,
        "seed": 1,
        "prompt_lens": prompt_lens,
        "response_lens": [2, 3],
        "max_token_len": 40,
        "padding_on_rank": 1,
        "model_dir": model_dir,
    }
    run = run_engine(tmp_path, spec, world_size=2, DUMP_PHASE="log_prob", PROMPTS_ONLY="1")
    assert run.returncode == 0, run.stderr[-3000:]
    samples = verl_cpu.random_samples(8, 1, prompt_lens=prompt_lens, response_lens=[2, 3])
    per_rank = {0: verl_cpu.shard(samples, 0, 2), 1: verl_cpu.shard(samples, 1, 2)[:3]}  # rank 1: no pad
    sizes = {}
    for rank in (0, 1):
        lines = run.log_lines(rank)
        assert [line["step"] for line in lines] == run.steps(rank) == list(range(len(per_rank[rank])))
        logged = sorted(
            (s["uid"], s["session_id"], s["prompt_len"], s["prompt_hash"]) for line in lines for s in line["samples"]
        )
        expected = sorted((s.uid, s.session_id, len(s.prompt), join_keys.prompt_hash(s.prompt)) for s in per_rank[rank])
        assert logged == expected
        for line in lines:
            shape = run.dump(line["step"], rank)["Module.model.embed_tokens.FSDPEmbedding.forward.0"]["input_args"][0]
            assert shape["shape"] == [1, line["samples"][0]["prompt_len"]]
        sizes[rank] = [sum(1 for line in lines if line["micro_batch"] == mb) for mb in (0, 1)]
    # The micro-batches really differed in size between the ranks (else this test proves nothing) ...
    assert sizes[0] != [2, 2] and sizes[0] != sizes[1]
    # ... and yet both ranks ran the same number of forwards: prompt-only, dummy and real ones.
    forwards = [len(run.results(rank)[0]["forward_tokens"]) for rank in (0, 1)]
    assert forwards[0] == forwards[1] == 7


def test_all_phases_dump_every_micro_batch_on_every_rank(tmp_path: Path, model_dir: str) -> None:
    prompt_lens = [5, 9, 4, 11, 6, 3, 8, 7]
    spec = {"ops": ["actor.log_prob", "actor.update"], "count": 8, "seed": 2, "prompt_lens": prompt_lens}
    run = run_engine(tmp_path, {**spec, "model_dir": model_dir}, world_size=2, DUMP_PHASE="all")
    assert run.returncode == 0, run.stderr[-3000:]
    samples = verl_cpu.random_samples(8, 2, prompt_lens=prompt_lens)
    for rank in (0, 1):
        mine = verl_cpu.shard(samples, rank, 2)
        lines = run.log_lines(rank)
        assert [(line["step"], line["phase"], line["micro_batch"]) for line in lines] == [
            (0, "log_prob", 0),
            (1, "log_prob", 1),
            (2, "update_actor", 0),
            (3, "update_actor", 1),
        ]
        assert run.steps(rank) == [0, 1, 2, 3]
        for line in lines:
            pair = mine[2 * line["micro_batch"] : 2 * line["micro_batch"] + 2]
            assert [s["uid"] for s in line["samples"]] == [s.uid for s in pair]
            assert [s["prompt_len"] for s in line["samples"]] == [len(s.prompt) for s in pair]
        assert any(".backward" in name for name in run.dump(3, rank))


def test_sequences_of_requests_chosen_on_one_rank_keep_the_ranks_in_step(tmp_path: Path, model_dir: str) -> None:
    # DUMP_REQUEST_IDS names one sample of rank 0's first micro-batch. Both ranks must run its
    # whole-sequence forwards there (rank 1 undumped), and neither any in the second micro-batch.
    prompt_lens = [5, 9, 4, 11, 6, 3, 8, 7]
    samples = verl_cpu.random_samples(8, 3, prompt_lens=prompt_lens)
    spec = {"ops": ["actor.log_prob"], "count": 8, "seed": 3, "prompt_lens": prompt_lens, "rollout_log_probs": True}
    env = {"DUMP_PHASE": "log_prob", "DUMP_SEQUENCES": "1", "DUMP_REQUEST_IDS": samples[1].request_id}
    run = run_engine(tmp_path, {**spec, "model_dir": model_dir}, world_size=2, **env)
    assert run.returncode == 0, run.stderr[-3000:]
    seq = [len(s.prompt) + len(s.response) for s in samples]
    for rank in (0, 1):
        first = 4 * rank
        assert run.results(rank)[0]["forward_tokens"] == [
            seq[first],
            seq[first + 1],
            seq[first] + seq[first + 1],
            seq[first + 2] + seq[first + 3],
        ]
        paths = run.dump_root.glob(f"*/{join_keys.GAP_LOG}")
        gaps = [json.loads(line) for path in paths for line in path.read_text().splitlines()]
        assert sorted(line["request_id"] for line in gaps if line["rank"] == rank) == sorted(
            s.request_id for s in samples[first : first + 4]
        )
    lines = run.log_lines(0)
    assert [(line["step"], line["micro_batch"], line["dump"], line["request_ids"]) for line in lines] == [
        (0, 0, "sequence", [samples[1].request_id])
    ]
    assert run.dump(0, 0)["Module.model.embed_tokens.FSDPEmbedding.forward.0"]["input_args"][0]["shape"] == [1, seq[1]]
    assert run.log_lines(1) == [] and run.steps(1) == []
