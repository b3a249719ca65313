"""Tensor-parallel shards made whole, and the replicas a job's samples were served by (golden trees, no engine).

``tests/golden/tp2`` holds real dumps of vLLM's and SGLang's CPU engines at TP 2 (one dump per rank and
prefill) against verl's FSDP2 engine, and ``tests/golden/replicas`` FSDP2 at world size 2 against two vLLM
replicas, one at TP 1 and one at TP 2 (``scripts/make_golden.py`` says how they were made). Faults are real
(a weights copy) or planted on one rank's statistics (what a weight scaled on one worker does to its slice).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas
import pytest
import torch
from support import golden

from msprobe_hooks.analysis.comparing.shards import ShardError, whole_stats, whole_tensor
from msprobe_hooks.analysis.comparing.statistics import Stats
from msprobe_hooks.analysis.pairing import pairs
from msprobe_hooks.analysis.pairing.pairs import RankRule
from msprobe_hooks.analysis.results import Status, Verdict
from msprobe_hooks.cli import main

TP2 = golden.GOLDEN / "tp2"
# The tensors a TP engine splits, per decoder layer: column-parallel outputs and row-parallel inputs (and the
# attention and activation outputs that are those inputs).
SPLIT = [
    ("self_attn.qkv_proj", "output"),
    ("self_attn.attn", "output"),
    ("self_attn.o_proj", "input"),
    ("mlp.gate_up_proj", "output"),
    ("mlp.act_fn", "output"),
    ("mlp.down_proj", "input"),
]
COMPARED_PER_PAIR = 19 * golden.LAYERS + 4  # as at TP 1 (tests/analysis/test_golden.py)
TP_REASONS = "tensor.parallel"  # every reason tensor parallelism gives (not the parameters' "shard weights")
# scripts/make_golden.py's replicas: replica A at TP 1 served req-0 and req-2, replica B at TP 2 req-1 and req-3;
# FSDP rank 0 holds req-0 and req-1, rank 1 req-2 and req-3.
SERVED_BY = {"req-0": "a", "req-1": "b", "req-2": "a", "req-3": "b"}
TRAIN_RANK = {"req-0": 0, "req-1": 0, "req-2": 1, "req-3": 1}


def align(tmp_path: Path, train: Path, generate: Path, *extra: str) -> Path:
    out = tmp_path / f"{generate.name}.jsonl"
    assert main(["align", str(train), str(generate), "-o", str(out), *extra]) == 0
    return out


def compare(pairs_file: Path, out: Path, *extra: str, status: int = 0) -> tuple[pandas.DataFrame, pandas.DataFrame]:
    assert main(["compare", str(pairs_file), "-o", str(out), "--jobs", "1", *extra]) == status
    return pandas.read_csv(out / "pairs.csv"), pandas.read_csv(out / "modules.csv")


def split_keys(layers: int = golden.LAYERS) -> set[tuple[str, str]]:
    return {(f"layers.{layer}.{module}", io) for layer in range(layers) for module, io in SPLIT}


def tp_rows(modules: pandas.DataFrame) -> pandas.DataFrame:
    rows = modules[modules.status == Status.NOT_COMPARABLE.value]
    return rows[rows.reason.str.contains(TP_REASONS, na=False)]


# --- align: every rank of the engine -----------------------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_align_pairs_each_prompt_with_its_dump_on_every_rank(tmp_path, capsys, engine):
    found = list(pairs.read(str(align(tmp_path, TP2 / "actor", TP2 / engine))))
    assert sorted(p.key for p in found) == sorted(golden.PROMPTS)
    for pair in found:
        shards = pair.generate.shards
        assert pair.rank_rule == RankRule.ALL_RANKS
        assert [s.rank for s in shards] == [0, 1]
        assert len({s.pid for s in shards}) == 2  # one process per rank, each with its own dispatch log
        assert {s.step for s in shards} == {pair.generate.step}
        assert (pair.generate.rank, pair.generate.dump) == (0, shards[0].dump)
        assert all(Path(s.dump).is_file() and f"/rank{s.rank}/" in s.dump for s in shards)
    out = capsys.readouterr().out
    assert not any(line.startswith("replica ") for line in out.splitlines())  # rank 1's copies are paired, not left
    assert "TP 2, ranks 0+1" in out


def test_a_tp1_pairs_file_is_written_as_before(tmp_path):
    line = json.loads(
        align(tmp_path, golden.GOLDEN / "fsdp2" / "actor", golden.GOLDEN / "vllm" / "generate")
        .read_text()
        .splitlines()[0]
    )
    assert "shards" not in line["generate"] and line["rank_rule"] == RankRule.SAME


# --- compare: split tensors made whole ------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_split_tensor_is_compared_whole(tmp_path, engine):
    results, modules = compare(align(tmp_path, TP2 / "actor", TP2 / engine), tmp_path / "report")
    assert list(results.verdict) == [Verdict.NO_DIVERGENCE.value] * 2
    assert list(results.compared) == [COMPARED_PER_PAIR] * 2
    assert tp_rows(modules).empty
    for _, rows in modules.groupby("pair"):
        whole = rows[rows.generate_name.str.contains("(ranks 0+1 made whole)", regex=False, na=False)]
        assert set(zip(whole.module, whole.io, strict=True)) == split_keys()
        assert (whole.status == Status.COMPARED.value).all()
        # The whole's shape is the training side's (rows of the last dimension): [T, 2 x the slice].
        assert all(
            t.split("x")[-1] == g.split("x")[-1] for t, g in zip(whole.train_shape, whole.generate_shape, strict=True)
        )
        assert whole.error.max() < 1e-5  # the same weights in fp32: a combination off by one slice is 1e-1


def test_without_the_other_ranks_split_tensors_are_not_comparable(tmp_path):
    # A pairs file naming one rank (an older align, or msprobe's rank filter): its slices are never passed off as whole.
    pairs_file = align(tmp_path, TP2 / "actor", TP2 / "vllm")
    lines = [json.loads(line) for line in pairs_file.read_text().splitlines()]
    for line in lines:
        del line["generate"]["shards"]
    pairs_file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    results, modules = compare(pairs_file, tmp_path / "report")
    assert list(results.compared) == [COMPARED_PER_PAIR - len(SPLIT) * golden.LAYERS] * 2
    rows = tp_rows(modules)
    assert len(rows) == 2 * len(split_keys())
    assert rows.reason.str.contains("names no other rank").all()


def test_a_planted_fault_in_a_column_parallel_module_is_named_there(tmp_path):
    # Layer 1's gate_proj and up_proj x1.04, a real vLLM run at TP 2: gate_up_proj's output is split on both ranks.
    results, _ = compare(align(tmp_path, TP2 / "actor", TP2 / "vllm_gate_up"), tmp_path / "report")
    assert list(results.verdict) == [Verdict.DIVERGES.value] * 2
    assert set(results.first_module) == {"layers.1.mlp.gate_up_proj"} and set(results.first_io) == {"output"}
    assert results.first_error.between(0.04 / 1.04 * 0.95, 0.04 / 1.04 * 1.05).all()


def test_a_fault_on_one_rank_only_is_named_at_its_module(tmp_path):
    # One worker's slice of layer 0's qkv_proj x1.05 (a weight update that reached rank 1 only): rank 0's slice is
    # intact, so a compare that took one rank's slice, or the replicated points after it, would name it late or never.
    tree = golden.copy("tp2", tmp_path)
    rank1 = [p for p in (tree / "vllm").glob("*/dispatch_log.jsonl") if '"rank":1' in p.read_text()]
    (folder,) = [p.parent for p in rank1]
    assert golden.scale_output(folder, "layers.0.self_attn.qkv_proj", 1.05) == 4  # 2 prefills + 2 decodes
    results, modules = compare(align(tmp_path, tree / "actor", tree / "vllm"), tmp_path / "report")
    assert set(results.first_module) == {"layers.0.self_attn.qkv_proj"}
    first = modules[(modules.module == "layers.0.self_attn.qkv_proj") & (modules.io == "output")]
    assert (first.error > 0.02).all()


def test_tensor_mode_makes_qkv_whole_part_by_part(tmp_path):
    results, modules = compare(align(tmp_path, TP2 / "tensor_actor", TP2 / "tensor_vllm"), tmp_path / "report")
    assert list(results["mode"]) == ["tensor"] * 2 and list(results.compared) == [COMPARED_PER_PAIR] * 2
    whole = modules[modules.generate_name.str.contains("made whole", na=False)]
    assert set(zip(whole.module, whole.io, strict=True)) == split_keys()
    # [q_0 q_1 | k_0 k_1 | v_0 v_1]: element by element equal to the training [q | k | v] (rank by rank: cosine ~0.3)
    assert (whole.cosine > 1 - 1e-9).all() and (whole.tensor_rel < 1e-5).all()


def test_which_tensors_are_split_is_the_rule_tables(tmp_path):
    # A --mapping rule for gate_up_proj without `parallel` (it replaces the built-in one): its outputs are no longer
    # made whole. The table, not code, says what a TP engine splits.
    mapping = tmp_path / "map.yaml"
    mapping.write_text(
        "rules:\n"
        '  - module: "layers.{layer}.mlp.gate_up_proj"\n'
        '    names: ["layers.{layer}.mlp.gate_up_proj"]\n'
        '    parts: ["layers.{layer}.mlp.gate_proj", "layers.{layer}.mlp.up_proj"]\n'
    )
    _, modules = compare(align(tmp_path, TP2 / "actor", TP2 / "vllm"), tmp_path / "report", "--mapping", str(mapping))
    assert set(tp_rows(modules).module) == {f"layers.{layer}.mlp.gate_up_proj" for layer in range(golden.LAYERS)}


def test_a_bad_parallel_value_stops_compare(tmp_path, capsys):
    mapping = tmp_path / "map.yaml"
    mapping.write_text('rules:\n  - module: "layers.{layer}.mlp.up_proj"\n    parallel: diagonal\n')
    pairs_file = align(tmp_path, TP2 / "actor", TP2 / "vllm")
    assert main(["compare", str(pairs_file), "-o", str(tmp_path / "r"), "--mapping", str(mapping)]) == 2
    assert "parallel: 'diagonal'; accepted: column, row, both" in capsys.readouterr().err


# --- the algebra ------------------------------------------------------------------------------------


def _stats(tensor: torch.Tensor) -> Stats:
    t = tensor.to(torch.float64)
    return Stats(tuple(t.shape), "torch.float64", float(t.max()), float(t.min()), float(t.mean()), float(t.norm()))


@pytest.mark.parametrize("dim", [-1, -2])
def test_whole_statistics_are_the_whole_tensors(dim):
    torch.manual_seed(0)
    whole = torch.randn(6, 4, 32)
    shards = list(torch.chunk(whole, 2, dim=dim))
    made = whole_stats([_stats(s) for s in shards], dim)
    expected = _stats(whole)
    assert made.shape == expected.shape
    for name in ("max", "min", "mean", "norm"):
        assert math.isclose(getattr(made, name), getattr(expected, name), rel_tol=1e-12, abs_tol=1e-15)


def test_whole_tensor_concatenates_part_by_part():
    q, k, v = (
        torch.arange(8.0).reshape(1, 8),
        torch.arange(8.0, 12.0).reshape(1, 4),
        torch.arange(12.0, 16.0).reshape(1, 4),
    )
    ranks = [torch.cat([q[:, :4], k[:, :2], v[:, :2]], dim=-1), torch.cat([q[:, 4:], k[:, 2:], v[:, 2:]], dim=-1)]
    assert torch.equal(whole_tensor(ranks, -1, [8, 4, 4]), torch.cat([q, k, v], dim=-1))
    assert not torch.equal(whole_tensor(ranks, -1), torch.cat([q, k, v], dim=-1))  # rank by rank is another tensor
    with pytest.raises(ShardError):
        whole_tensor(ranks, -1, [7, 5, 4])  # parts that do not split over the ranks


def test_shards_that_do_not_line_up_are_refused():
    with pytest.raises(ShardError, match="differ outside dimension -1"):
        whole_stats([Stats((6, 64), "f", 1, 0, 0, 1), Stats((5, 64), "f", 1, 0, 0, 1)], -1)


# --- replicas and ranks -------------------------------------------------------------------------------


def test_every_sample_is_paired_with_the_replica_and_ranks_that_served_it(tmp_path, capsys):
    root = golden.GOLDEN / "replicas"
    found = {p.key: p for p in pairs.read(str(align(tmp_path, root / "actor", root / "generate")))}
    assert sorted(found) == sorted(SERVED_BY)
    engines = {
        replica: {
            tuple((s.rank, s.pid) for s in p.generate.shards or []) or ((p.generate.rank, p.generate.pid),)
            for key, p in found.items()
            if SERVED_BY[key] == replica
        }
        for replica in "ab"
    }
    assert all(len(e) == 1 for e in engines.values())  # each replica's samples name the same workers
    (a,), (b,) = engines["a"], engines["b"]
    assert len(a) == 1 and [rank for rank, _ in b] == [0, 1]  # replica A: TP 1; B: TP 2, a process per rank
    assert not {pid for _, pid in a} & {pid for _, pid in b}
    assert {key: p.train.rank for key, p in found.items()} == TRAIN_RANK
    assert {key: p.rank_rule for key, p in found.items()} == {
        "req-0": RankRule.SAME,  # training rank 0, replica A's rank 0
        "req-2": RankRule.FSDP_ANY,  # training rank 1: replica A has rank 0 only
        "req-1": RankRule.ALL_RANKS,
        "req-3": RankRule.ALL_RANKS,
    }
    out = capsys.readouterr().out
    assert (
        f"TP 1, rank 0, pid {a[0][1]}: 2 pairs" in out and f"TP 2, ranks 0+1, pid {b[0][1]}+{b[1][1]}: 2 pairs" in out
    )
    results, modules = compare(tmp_path / "generate.jsonl", tmp_path / "report")
    assert list(results.verdict) == [Verdict.NO_DIVERGENCE.value] * 4
    assert list(results.compared) == [COMPARED_PER_PAIR] * 4 and tp_rows(modules).empty
