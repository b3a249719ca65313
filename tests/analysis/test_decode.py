"""Decode pairs on real packed dumps (``tests/golden/decode``, cut by ``scripts/make_golden.py --only decode``).

vLLM's and SGLang's CPU engines generated first, several requests per model step, every step dumped in
tensor mode (vLLM: but the ones a step filter left out); then verl's FSDP2 engine ran each prompt with the
response the rollout gave it, one whole-sequence dump per sample (``DUMP_SEQUENCES=1``), or the real
micro-batch packing two samples (``actor_micro_batch``). ``align`` must pair each response token after the
first with the row that sampled it, wherever the packing put that row; ``compare`` must cut exactly those
rows. No engine starts: these run in the fast tier. Faults are planted in copies of the tensor files, in
the rows of one token.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy
import pandas
import pytest
from support import golden
from support.compare_runs import unpaired_table
from support.pages import assert_answer_first

from msprobe_hooks.analysis.answer.verdict import rules
from msprobe_hooks.analysis.layout import find_logs
from msprobe_hooks.analysis.one_pair import judged_pair
from msprobe_hooks.analysis.pairing import pairs
from msprobe_hooks.analysis.pairing.align import Result, pair_logs
from msprobe_hooks.analysis.results import DEFAULT_THRESHOLD, CausePath, PairResult, Unpaired, Verdict
from msprobe_hooks.cli import main
from msprobe_hooks.join_keys import DISPATCH_LOG, GAP_LOG, TRAINING_LOG
from msprobe_hooks.log import NAME as LOGGER

DECODE = golden.DECODE
# Per decode pair, every comparable tensor of the 2-layer model (as for a prefill pair: golden COMPARED_PER_PAIR).
COMPARED = 19 * golden.LAYERS + 4
FP32 = 1e-5  # identical weights in fp32: measured <= 5e-7 on every decode pair here

# (request, position) -> (inference step, its rows in that step's dump), read off the dispatch logs once.
# vLLM: req-0 alone (step 0), its decode beside the prefills of req-1 and req-2 (step 1), three decode rows
# (step 2), req-1 finished and req-2 moved from row 2 to row 1 (step 3); pre-c's last decode before it was
# preempted (step 6), its recompute (step 8: prompt and 3 generated tokens in one row, the next token sampled
# from its last row), its decode after it (step 9). Steps 5 and 7 were not dumped (msprobe's step filter).
VLLM_DECODE = {
    ("req-0", 6): (1, [0, 1]),
    ("req-0", 7): (2, [0, 1]),
    ("req-0", 8): (3, [0, 1]),
    ("req-1", 4): (2, [1, 2]),
    ("req-2", 5): (2, [2, 3]),
    ("req-2", 6): (3, [1, 2]),
    ("pre-c", 6): (6, [2, 3]),
    ("pre-c", 7): (8, [7, 8]),
    ("pre-c", 8): (9, [0, 1]),
}
# SGLang: one wave, prefills chunked by 8 tokens and mixed with decode rows: req-0's first decode sits at
# row 7 of step 1, after req-1's second chunk and req-2's whole prompt; the decode rows reorder after it.
SGLANG_DECODE = {
    ("req-0", 6): (1, [7, 8]),
    ("req-0", 7): (2, [2, 3]),
    ("req-0", 8): (3, [2, 3]),
    ("req-1", 4): (2, [0, 1]),
    ("req-2", 5): (2, [1, 2]),
    ("req-2", 6): (3, [1, 2]),
}
# Prefill pairs: request -> (inference step, its rows; None: the whole dump). A prompt-only dump pairs whole
# with a step holding that prompt alone (req-0's in vLLM); a packed prefill pairs with its rows of the step,
# from a sequence's prompt rows (``actor_micro_batch`` has no prompt-only dumps: req-0's too).
PREFILL_ROWS = {
    ("actor", "vllm"): {"req-0": (0, None), "req-1": (1, [1, 5]), "req-2": (1, [5, 10])},
    ("actor", "sglang"): {"req-0": (0, [0, 6]), "req-2": (1, [2, 7])},  # req-1's prompt: chunked
    ("actor_micro_batch", "vllm"): {"req-0": (0, [0, 6]), "req-1": (1, [1, 5])},
    ("actor_micro_batch", "sglang"): {"req-0": (0, [0, 6])},
}
EXPECTED = {"vllm": VLLM_DECODE, "sglang": SGLANG_DECODE}
MICRO_BATCH = ("req-0", "req-1")  # actor_micro_batch's one dump: both samples, back to back (offsets 0 and 10)


@pytest.fixture
def warnings(caplog) -> Iterator[Callable[[], list[str]]]:
    """The lines ``align`` warned in this test (each is one stderr line of the command): the hooks' logger,
    which does not propagate, writes to pytest's capture alone for the test."""
    log = logging.getLogger(LOGGER)
    saved = log.handlers[:], log.propagate
    log.handlers, log.propagate = [caplog.handler], False
    yield lambda: [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    log.handlers, log.propagate = saved


def aligned(train: Path, generate: Path, out: Path) -> tuple[Result, list[pairs.Pair]]:
    """``align``'s result on two trees, and its pairs as ``compare`` reads them (dump paths resolved)."""
    result = pair_logs(find_logs(str(train), TRAINING_LOG), find_logs(str(generate), DISPATCH_LOG), str(out))
    out.mkdir(parents=True, exist_ok=True)
    pairs.write(result.pairs, str(out / "pairs.jsonl"))
    return result, list(pairs.read(str(out / "pairs.jsonl")))


def decode_pairs(found: list[pairs.Pair]) -> dict[tuple[str, int], pairs.Pair]:
    return {(p.key, p.position): p for p in found if p.kind == pairs.PairKind.DECODE}


def table(counter: Counter) -> dict[str, int]:
    return {str(reason): n for reason, n in counter.items()}


def log_lines(root: Path, name: str) -> list[dict]:
    (path,) = root.glob(f"*/{name}")
    return [json.loads(line) for line in path.read_text().splitlines()]


def embedding_ids(dump: str) -> numpy.ndarray:
    """The token ids a dumped forward fed its embedding, one per row."""
    return numpy.load(golden.tensor_file(Path(dump), "embed_tokens", io="input")).reshape(-1)


def verdicts(found: list[pairs.Pair]) -> dict[tuple[str, int | None], PairResult]:
    """(request, position) -> compare's result for that pair (prefill pairs: position None)."""
    results = {}
    for index, pair in enumerate(found):
        result, _ = judged_pair(index, pair, rules(DEFAULT_THRESHOLD))
        results[(pair.key, pair.position)] = result
    return results


# --- pairing ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("train", ["actor", "actor_micro_batch"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_each_response_token_after_the_first_meets_the_row_that_sampled_it(tmp_path, train, engine):
    _, found = aligned(DECODE / train, DECODE / engine, tmp_path)
    samples = {s["request_id"]: s for line in log_lines(DECODE / train, TRAINING_LOG) for s in line["samples"]}
    expected = {key: where for key, where in EXPECTED[engine].items() if key[0] in samples}
    got = decode_pairs(found)
    assert {key: (p.generate.step, p.generate.rows) for key, p in got.items()} == expected
    for (request, position), pair in got.items():
        sample = samples[request]
        start = sample["offset"] + position
        assert pair.train.rows == [start, start + 1]  # the sample's row in the training forward
        assert pair.token_index == position - sample["prompt_len"] + 1
        assert 1 <= pair.token_index < sample["seq_len"] - sample["prompt_len"]  # a response token, not the first
    # The rows hold one token, the same one on both sides: the one fed at that position of the sequence.
    for pair in found:
        if pair.train.rows is None:
            continue
        fed = embedding_ids(pair.train.dump)[slice(*pair.train.rows)]
        generated = embedding_ids(pair.generate.dump)
        assert list(fed) == list(generated[slice(*pair.generate.rows)] if pair.generate.rows else generated), pair
    prefill = {p.key: (p.generate.step, p.generate.rows) for p in found if p.kind == pairs.PairKind.PREFILL}
    assert prefill == PREFILL_ROWS[(train, engine)]


def test_a_preempted_request_pairs_its_recomputed_token_from_the_recompute_and_the_later_ones_from_decode_rows(
    tmp_path,
):
    lines = {line["step"]: line for line in log_lines(DECODE / "vllm", DISPATCH_LOG)}
    rows = {step: {r["request_id_base"]: r for r in line["requests"]} for step, line in lines.items()}
    # What the dispatch log says of vLLM V1's recompute preemption: pre-c runs at step 6, is gone at step 7
    # (pre-a took its block), and comes back at step 8 as a prefill row of its prompt and the 3 tokens it had
    # generated, nothing computed before (the KV cache was freed): not a full prefill (it holds more than the
    # prompt), beside pre-b's decode row, which the packing moved behind it.
    assert "pre-c" in rows[6] and "pre-c" not in rows[7]
    resumed = rows[8]["pre-c"]
    assert (resumed["type"], resumed["prefill"], resumed["computed_tokens"], resumed["full_prefill"]) == (
        "cached",
        True,
        0,
        False,
    )
    assert (resumed["offset"], resumed["tokens"], resumed["prompt_len"]) == (0, 5 + 3, 5)
    assert (rows[8]["pre-b"]["offset"], rows[8]["pre-b"]["computed_tokens"]) == (8, 7)
    assert [rows[9]["pre-c"][k] for k in ("prefill", "computed_tokens")] == [False, 8]  # decoding again
    result, found = aligned(DECODE / "actor", DECODE / "vllm", tmp_path)
    got = {key: p for key, p in decode_pairs(found).items() if key[0] == "pre-c"}
    # Token 3 (position 7) was sampled from the recompute's last row; the rows before it recomputed positions
    # whose tokens earlier decode steps had sampled (position 6: step 6's row). Token 1 (step 5) and the
    # prompt's prefill (step 4) were not dumped.
    assert {key: (p.generate.step, p.generate.rows, p.generate.tokens) for key, p in got.items()} == {
        ("pre-c", 6): (6, [2, 3], 1),
        ("pre-c", 7): (8, [7, 8], 8),
        ("pre-c", 8): (9, [0, 1], 1),
    }
    assert not [p for p in found if p.key == "pre-c" and p.kind == pairs.PairKind.PREFILL]  # the recompute is none
    assert table(result.train_unpaired) == {
        Unpaired.NOT_DUMPED.value: 1,  # pre-c's prompt: its prefill step (4) was not dumped
        Unpaired.MULTI_REQUEST.value: 2,  # req-1's and req-2's prompts: packed (their sequences' rows pair)
    }
    assert result.generate_unpaired == {}  # every dumped step is in a pair
    results = verdicts([p for p in found if p.key == "pre-c"])
    assert {key: (r.verdict, r.compared) for key, r in results.items()} == {
        key: (Verdict.NO_DIVERGENCE, COMPARED) for key in got
    }


def test_sglangs_step_past_the_last_token_and_its_chunked_prefill_pair_nothing(tmp_path):
    result, found = aligned(DECODE / "actor", DECODE / "sglang", tmp_path)
    lines = log_lines(DECODE / "sglang", DISPATCH_LOG)
    samples = {s["request_id"]: s for line in log_lines(DECODE / "actor", TRAINING_LOG) for s in line["samples"]}
    # SGLang decodes once more after each request's last token (it discards the output): its last step holds
    # only such rows, each at its sequence's last position, which no response token was sampled from.
    last = lines[-1]["requests"]
    assert [(r["request_id_base"], r["computed_tokens"]) for r in last] == [
        (r["request_id_base"], samples[r["request_id_base"]]["seq_len"] - 1) for r in last
    ]
    assert not [p for p in found if p.generate.step == lines[-1]["step"]]
    assert table(result.generate_unpaired) == {Unpaired.PAST_RESPONSE.value: 1}
    # req-1's prompt was prefilled in two chunks (steps 0 and 1): no prefill pair, its decode token pairs.
    chunks = [r for line in lines for r in line["requests"] if r["request_id_base"] == "req-1" and r["prefill"]]
    assert [(r["tokens"], r["computed_tokens"], r["full_prefill"]) for r in chunks] == [(2, 0, False), (2, 2, False)]
    assert [(p.kind, p.position) for p in found if p.key == "req-1"] == [(pairs.PairKind.DECODE, 4)]
    assert table(result.train_unpaired) == {
        Unpaired.NOT_FULL_PREFILL.value: 1,  # req-1's prompt dump
        Unpaired.MULTI_REQUEST.value: 2,  # req-0's and req-2's prompt dumps: packed
        Unpaired.NO_COUNTERPART.value: 2,  # pre-c's prompt and sequence: SGLang never ran it
    }


# --- comparing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("train", "engine"), [("actor", "vllm"), ("actor", "sglang"), ("actor_micro_batch", "vllm")])
def test_identical_weights_no_decode_pair_names_anything(tmp_path, train, engine):
    _, found = aligned(DECODE / train, DECODE / engine, tmp_path)
    results = verdicts(found)
    assert {r.verdict for r in results.values()} == {Verdict.NO_DIVERGENCE}
    assert {r.compared for r in results.values()} == {COMPARED}
    assert {r.mode for r in results.values()} == {"tensor"}
    assert max(r.max_error for r in results.values()) < FP32


# (case, tree to edit, dump of that tree, module, rows in that dump, the one pair that must name it)
FAULTS = {
    # vLLM step 2 packs three decode rows: req-1's is row 1; req-0's (row 0) and req-2's (row 2) share its files.
    "vllm packed decode row": ("vllm", "vllm/*/step2", "layers.1.mlp.down_proj", (1, 2), ("req-1", 4)),
    # SGLang's mixed step: req-0's decode row 7, right after req-2's whole prompt (rows 2-6, a prefill pair).
    "sglang decode row after a prefill": ("sglang", "sglang/*/step1", "layers.1.mlp.down_proj", (7, 8), ("req-0", 6)),
    # The recompute's last row (token 3); its row 6 recomputed a position sampled earlier: no pair uses it.
    "vllm recompute's last row": ("vllm", "vllm/*/step8", "layers.0.self_attn.o_proj", (7, 8), ("pre-c", 7)),
    "vllm recomputed row no token came from": ("vllm", "vllm/*/step8", "layers.0.self_attn.o_proj", (6, 7), None),
    # The training side: req-2's sequence dump (step 5), position 6; the micro-batch dump, req-1's position 4.
    "training sequence row": ("vllm", "actor/step5", "layers.0.self_attn.o_proj", (6, 7), ("req-2", 6)),
    "training micro-batch row": ("vllm", "actor_micro_batch/step0", "layers.1.mlp.down_proj", (14, 15), ("req-1", 4)),
}


# The other pairs that read the edited file and must stay clean: step 2's other two decode rows; step 1's
# prefill of req-2 (rows 2-6) and req-1's second chunk (no pair); pre-b's row in the recompute step is no pair
# (not dumped on the training side), so the recompute's last row is the one pair there; req-2's prefill and
# other decode token in its sequence; req-0's prefill and decode tokens in the micro-batch.
READING_CLEAN = {
    "vllm packed decode row": 2,
    "sglang decode row after a prefill": 1,
    "vllm recompute's last row": 0,
    "vllm recomputed row no token came from": 1,
    "training sequence row": 2,
    "training micro-batch row": 5,
}


@pytest.mark.parametrize("case", list(FAULTS))
def test_a_fault_in_one_tokens_rows_is_named_at_that_token_only(tmp_path, case):
    engine, where, module, rows, named = FAULTS[case]
    tree = where.split("/")[0]
    copy = tmp_path / tree
    shutil.copytree(DECODE / tree, copy)  # the edited tree; the other side is read in place
    (dump,) = copy.glob(f"{where.split('/', 1)[1]}/rank0/dump.json")
    golden.scale_rows(dump, module, rows, 1.05)
    train = tree if tree.startswith("actor") else "actor"
    _, found = aligned(copy if train == tree else DECODE / train, copy if engine == tree else DECODE / engine, tmp_path)
    # Every pair that reads the edited file: the planted token's, and the others of that step or sequence.
    reading = [p for p in found if str(dump) in (p.train.dump, p.generate.dump)]
    results = verdicts(reading)
    diverging = {key: r for key, r in results.items() if r.verdict is Verdict.DIVERGES}
    assert set(diverging) == ({named} if named else set())
    for result in diverging.values():
        assert (result.first_module, result.first_io, result.first_rule) == (module, "output", "step")
        # ||train - inference|| / ||inference||: 0.05 / 1.05 planted on the inference side, 0.05 on the training one
        assert result.first_error == pytest.approx(0.05 if tree.startswith("actor") else 0.05 / 1.05, rel=1e-4)
    clean = [r for key, r in results.items() if key not in diverging]
    assert all(r.verdict is Verdict.NO_DIVERGENCE and r.max_error < FP32 for r in clean)
    assert len(clean) >= READING_CLEAN[case]


def test_the_report_puts_a_decode_rows_fault_on_the_decode_path_of_its_sample_only(tmp_path, capsys):
    copy = golden.copy("decode", tmp_path)
    (dump,) = copy.glob("vllm/*/step2/rank0/dump.json")
    golden.scale_rows(dump, "layers.1.mlp.down_proj", (1, 2), 1.05)  # req-1's decode row
    found, report = tmp_path / "pairs.jsonl", tmp_path / "report"
    assert main(["align", str(copy / "actor"), str(copy / "vllm"), "-o", str(found)]) == 0
    assert main(["compare", str(found), "-o", str(report), "--jobs", "1"]) == 0
    printed = capsys.readouterr().out
    samples = pandas.read_csv(report / "samples.csv", keep_default_na=False).set_index("request_id")
    assert samples["path"].to_dict() == {
        "req-0": CausePath.NEITHER.value,
        "req-1": CausePath.DECODE.value,
        "req-2": CausePath.NEITHER.value,
        "pre-c": CausePath.NEITHER.value,
        "pre-a": "",  # in the batch (a gap line), not dumped (DUMP_REQUEST_IDS)
        "pre-b": "",
    }
    assert "cause: decode path: layers.1.mlp.down_proj output diverges at decode tokens only" in printed
    assert_answer_first(report, printed)  # the path's verdict under the overall one, before the notes
    # The symptom beside it: the gap the training side logged (the rollout's own log-probs, fp32: ~1e-7).
    assert (samples["gap_max"] < FP32).all()


def test_the_symptom_is_read_from_the_gap_logs_the_pairs_name_or_by_the_layout_in_an_older_pairs_file(tmp_path):
    copy = golden.copy("decode", tmp_path)
    found, report = tmp_path / "pairs.jsonl", tmp_path / "report"
    assert main(["align", str(copy / "actor"), str(copy / "vllm"), "-o", str(found)]) == 0
    lines = [json.loads(line) for line in found.read_text().splitlines()]
    (gap_log,) = (copy / "actor").glob(f"*/{GAP_LOG}")
    assert {tuple(line["train"]["gap_logs"]) for line in lines} == {(str(gap_log.relative_to(tmp_path)),)}
    assert main(["compare", str(found), "-o", str(report), "--jobs", "1"]) == 0
    expected = (report / "samples.csv").read_bytes()
    assert b"pre-a" in expected  # a sample of the gap log alone
    moved = tmp_path / "gaps.jsonl"  # not where the layout puts it: compare must take the pairs' word for it
    gap_log.rename(moved)
    for line in lines:
        line["train"]["gap_logs"] = [str(moved)]
    found.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["compare", str(found), "-o", str(report), "--jobs", "1"]) == 0
    assert (report / "samples.csv").read_bytes() == expected
    moved.rename(gap_log)  # an older align's pairs file names no gap logs: the layout finds them
    for line in lines:
        del line["train"]["gap_logs"]
    found.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["compare", str(found), "-o", str(report), "--jobs", "1"]) == 0
    assert (report / "samples.csv").read_bytes() == expected


# --- bad input ----------------------------------------------------------------------------------------


def test_a_missing_sequence_dump_is_named_and_the_other_samples_still_pair(tmp_path, warnings):
    copy = golden.copy("decode", tmp_path)
    steps = {
        line["samples"][0]["request_id"] + "/" + line["dump"]: line["step"]
        for line in log_lines(copy / "actor", TRAINING_LOG)
    }
    missing = copy / "actor" / f"step{steps['pre-c/sequence']}" / "rank0" / "dump.json"
    missing.unlink()
    found = tmp_path / "pairs.jsonl"
    assert main(["align", str(copy / "actor"), str(copy / "vllm"), "-o", str(found)]) == 0
    err = warnings()
    assert len(err) == 1 and str(missing) in err[0]
    kept = list(pairs.read(str(found)))
    assert {(p.key, p.position) for p in kept} == {k for k in VLLM_DECODE if k[0] != "pre-c"} | {
        (k, None) for k in PREFILL_ROWS[("actor", "vllm")]
    }
    result, _ = aligned(copy / "actor", copy / "vllm", tmp_path / "again")
    assert table(result.train_unpaired)[Unpaired.DUMP_UNREADABLE.value] == 1
    # The dumped steps only pre-c's sequence wanted (6, 8 and 9): unpaired for the same reason.
    assert table(result.generate_unpaired) == {Unpaired.DUMP_UNREADABLE.value: 3}


def test_a_missing_decode_step_dump_is_named_and_its_tokens_left_out(tmp_path, warnings):
    copy = golden.copy("decode", tmp_path)
    (missing,) = copy.glob("sglang/*/step3/rank0/dump.json")
    missing.unlink()
    result, found = aligned(copy / "actor", copy / "sglang", tmp_path / "pairs")
    err = warnings()
    assert len(err) == 1 and str(missing) in err[0]
    assert set(decode_pairs(found)) == {key for key, (step, _) in SGLANG_DECODE.items() if step != 3}
    assert table(result.generate_unpaired) == {Unpaired.DUMP_UNREADABLE.value: 1, Unpaired.PAST_RESPONSE.value: 1}


def test_a_request_on_one_side_only_is_counted_there_and_the_others_pair(tmp_path, capsys):
    # The generate side only: actor_micro_batch dumped req-0 and req-1; vLLM's preemption steps hold pre-*.
    found = tmp_path / "pairs.jsonl"
    assert main(["align", str(DECODE / "actor_micro_batch"), str(DECODE / "vllm"), "-o", str(found)]) == 0
    printed = capsys.readouterr().out
    kept = {(p.key, p.position) for p in pairs.read(str(found))}
    assert kept == {k for k in VLLM_DECODE if k[0] in MICRO_BATCH} | {(k, None) for k in MICRO_BATCH}
    # Steps 6 and 9 run only requests no training dump knows; step 8, the recompute, is a prefill step
    # nothing paired, and so, as any, says why no prompt could pair with it.
    assert unpaired_table(printed) == {
        Unpaired.NOT_FULL_PREFILL.value: (0, 1),
        Unpaired.NO_COUNTERPART.value: (0, 2),
    }
    # The training side only: SGLang never ran pre-c, whose prompt and sequence were dumped.
    result, found_sglang = aligned(DECODE / "actor", DECODE / "sglang", tmp_path / "sglang")
    assert table(result.train_unpaired)[Unpaired.NO_COUNTERPART.value] == 2
    assert {p.key for p in found_sglang} == {"req-0", "req-1", "req-2"}


def test_statistics_dumps_as_msprobe_writes_them_are_the_tensor_dumps_without_their_files(tmp_path):
    """The ground of :func:`golden.as_statistics`: the namings set ran the same forwards in both modes."""
    golden.copy("tensor", tmp_path)
    for tensor, statistics in (("tensor/actor", "fsdp2/actor"), ("tensor/generate", "vllm/generate")):
        copy = tmp_path / tensor
        golden.as_statistics(copy)
        ours = [json.loads(p.read_text()) for p in golden.dumps(copy)]
        theirs = [json.loads(p.read_text()) for p in golden.dumps(golden.GOLDEN / statistics)]
        assert ours == theirs
        assert not list(copy.rglob("dump_tensor_data"))


def test_statistics_dumps_pair_but_no_token_row_is_cut_from_them(tmp_path, capsys):
    copy = golden.copy("decode", tmp_path)
    for tree in ("actor", "vllm"):
        golden.as_statistics(copy / tree)
    found, report = tmp_path / "pairs.jsonl", tmp_path / "report"
    assert main(["align", str(copy / "actor"), str(copy / "vllm"), "-o", str(found)]) == 0
    assert {(p.key, p.position) for p in pairs.read(str(found)) if p.kind == pairs.PairKind.DECODE} == set(VLLM_DECODE)
    assert main(["compare", str(found), "-o", str(report), "--jobs", "1"]) == 0  # not a failure: a collection choice
    printed = capsys.readouterr().out
    results = pandas.read_csv(report / "pairs.csv", keep_default_na=False)
    cut = results[results["position"] != ""]  # decode pairs
    assert set(cut["verdict"]) == {Verdict.STATISTICS.value}
    assert cut["message"].str.contains("statistics dumps hold whole tensors' statistics").all()
    # Only the prefill alone in its step (req-0's) is compared whole, on its statistics; the packed ones are cut.
    whole = results[(results["kind"] == "prefill") & (results["verdict"] != Verdict.STATISTICS.value)]
    assert list(whole["key"]) == ["req-0"] and set(whole["mode"]) == {"statistics"}
    assert f"(pre-c, decode token 3): {Verdict.STATISTICS.value}" in printed
