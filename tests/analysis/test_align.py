"""``msprobe-hooks align``: real training dumps against dispatch logs and real msprobe dumps, in-process.

The training side is one run of verl's real FSDP2 engine on CPU with ``DUMP_ON=1 PROMPTS_ONLY=1``
(the README demo: four prompt-only dumps, request ids ``req-uid-0`` … ``req-uid-3``), cut once into
``tests/golden/align/actor`` (``scripts/make_golden.py``). The inference side is built per test:
dispatch-log lines from the real ``dispatch_log.step_line``, and ``dump.json`` files written by real
msprobe on a toy model whose embedding is named as vLLM's (``model.embed_tokens.VocabParallelEmbedding``,
input ``[T]``), one per token count (``tests/golden/align/embedding``). The command runs as ``cli.main``
(its stdout and the hooks' logger's lines captured); what it loads is tested in a fresh interpreter
(test_align_interpreter.py), the real vLLM engine's end-to-end pair separately.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support.compare_runs import raw_pairs
from support.compare_runs import unpaired_table as table
from support.dispatch_lines import step_record
from support.golden import GOLDEN

from cpu_kit import verl_cpu  # the demo's samples: the prompts the training side dumped
from msprobe_hooks import cli
from msprobe_hooks.analysis.pairing import logs
from msprobe_hooks.inference.dispatch_log import ScheduledRequest
from msprobe_hooks.join_keys import PROMPT_HASH_VERSION, prompt_hash, versioned_hash
from msprobe_hooks.log import NAME as LOGGER

SAMPLES = verl_cpu.random_samples(4, seed=0)
SUFFIX = "-1a2b3c4d"  # vLLM >= 0.14 appends one to every client id
GEN_PID = 4242


# --- the two sides ---------------------------------------------------------------------------


@pytest.fixture
def training() -> Path:
    """The actor dump root of one real run: step0..3/rank0/dump.json and {pid}/update_actor_log.jsonl."""
    return GOLDEN / "align" / "actor"


def test_the_run_dumped_the_demos_samples(training):
    lines = train_lines(training)
    assert [line["samples"][0]["request_id"] for line in lines] == [s.request_id for s in SAMPLES]
    # Both sides hash the prompt the same way, or the hash rule could never pair anything.
    assert [line["samples"][0]["prompt_hash"] for line in lines] == [prompt_hash(s.prompt) for s in SAMPLES]


def train_lines(root: Path) -> list[dict]:
    (log,) = root.glob("*/update_actor_log.jsonl")
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture
def embedding_dumps() -> dict[int, Path]:
    """Real msprobe step folders (their dump.json), one per embedding token count."""
    return {int(p.name.removeprefix("tokens")): p for p in (GOLDEN / "align" / "embedding").iterdir()}


def full_prefill(sample: verl_cpu.Sample, request_id: str | None = "", hashed: bool = True) -> ScheduledRequest:
    """A request's whole prompt in one step; ``request_id`` None: the engine gave no id."""
    raw = sample.request_id + SUFFIX if request_id == "" else request_id
    base = None if raw is None else raw.removesuffix(SUFFIX)
    n = len(sample.prompt)
    return ScheduledRequest(raw, base, True, n, 0, n, prompt_hash(sample.prompt) if hashed else None)


def decode(sample: verl_cpu.Sample, done: int = 0) -> ScheduledRequest:
    n = len(sample.prompt)
    return ScheduledRequest(
        sample.request_id + SUFFIX, sample.request_id, False, 1, n + done, n, prompt_hash(sample.prompt)
    )


def compact(record: dict) -> str:
    """A log line as JsonlLog writes it."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


class GenTree:
    """``{generate dump_path}/{pid}/dispatch_log.jsonl`` and ``{pid}/step{N}/rank{R}/``, as the vLLM patch
    writes them."""

    def __init__(self, root: Path, dumps: dict[int, Path]) -> None:
        self.root = root
        self.dumps = dumps

    def step(
        self,
        step: int,
        requests: list[ScheduledRequest],
        *,
        pid: int = GEN_PID,
        rank: int = 0,
        dumped: bool = True,
        dump_tokens: int | None = -1,
    ) -> None:
        """One model step; its dump holds ``dump_tokens`` (default: all the step's tokens; None: no dump)."""
        record = step_record(
            engine="vllm", engine_version="0.32.0", rank=rank, step=step, dumped=dumped, requests=requests
        )
        record["pid"] = pid
        self.line(record, pid)
        if dumped and dump_tokens is not None:
            tokens = sum(r.tokens for r in requests) if dump_tokens == -1 else dump_tokens
            self.copy_dump(tokens, pid, step, rank)

    def line(self, record: dict | str, pid: int = GEN_PID) -> None:
        path = self.root / str(pid) / "dispatch_log.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            handle.write((record if isinstance(record, str) else compact(record)) + "\n")

    def copy_dump(self, tokens: int, pid: int, step: int, rank: int) -> None:
        shutil.copytree(self.dumps[tokens], self.root / str(pid) / f"step{step}" / f"rank{rank}")


@pytest.fixture
def gen(tmp_path, embedding_dumps) -> GenTree:
    return GenTree(tmp_path / "generate", embedding_dumps)


@pytest.fixture
def align(capsys, monkeypatch) -> Callable[..., tuple[int, str, str, list[dict]]]:
    """Runs the command (``cli.main``); returns (status, stdout, stderr, pairs read back). The hooks' logger
    writes to this test's captured stderr: a handler of its own for the test (the logger's holds the stream
    it was built with)."""
    log = logging.getLogger(LOGGER)
    monkeypatch.setattr(log, "handlers", [logging.StreamHandler(sys.stderr)])
    monkeypatch.setattr(log, "propagate", False)

    def run(train: Path, generate: Path, out: Path, *options: str) -> tuple[int, str, str, list[dict]]:
        capsys.readouterr()
        status = cli.main(["align", str(train), str(generate), "-o", str(out), *options])
        done = capsys.readouterr()
        return status, done.out, done.err, raw_pairs(out) if out.is_file() else []

    return run


def keys(found: list[dict]) -> list[tuple]:
    return [(p["rule"], p["key"], p["train"]["step"], p["generate"]["step"], p["generate"]["rank"]) for p in found]


# --- the join rules --------------------------------------------------------------------------


def test_request_id_rule_pairs_every_prompt(training, gen, tmp_path, align):
    for n, sample in enumerate(SAMPLES):
        gen.step(n, [full_prefill(sample)])
    gen.step(4, [decode(s) for s in SAMPLES])
    status, out, err, found = align(training, gen.root, tmp_path / "pairs.jsonl")
    assert status == 0, err
    assert keys(found) == [("request_id", s.request_id, n, n, 0) for n, s in enumerate(SAMPLES)]
    first = found[0]
    assert first["prompt_len"] == 5 and first["rank_rule"] == "same"
    assert first["generate"]["request_id"] == "req-uid-0" + SUFFIX and first["generate"]["filtered"] is False
    assert first["train"]["uid"] == "uid0" and first["train"]["global_step"] == 1
    assert first["generate"]["engine"] == "vllm" and first["train"]["format"] == "msprobe-hooks"
    assert "4 pairs (request_id: 4) from 4 training dumps and 5 generate dumps" in out
    assert table(out) == {"decode only": (0, 1)}
    for pair in found:  # both dump.json files, the training one at the log's step
        assert Path(pair["train"]["dump"]).is_file() and Path(pair["generate"]["dump"]).is_file()
        assert Path(pair["train"]["dump"]).parent.parent.name == f"step{pair['train']['step']}"


def test_prompt_hash_rule_when_the_engine_gives_no_id(training, gen, tmp_path, align):
    for n, sample in enumerate(SAMPLES):
        gen.step(n, [full_prefill(sample, request_id=None)])
    status, out, err, found = align(training, gen.root, tmp_path / "pairs.jsonl")
    assert status == 0, err
    # The key is the hash as align joins it: with its definition's version (v2, SHA-1 over the ids' bytes).
    assert keys(found) == [("prompt_hash", f"{prompt_hash(s.prompt)}/v2", n, n, 0) for n, s in enumerate(SAMPLES)]
    assert "(prompt_hash: 4)" in out


def _v1_hash(ids) -> str:
    """The first definition of the prompt hash (logs before the version field): SHA-1 of the decimal ids."""
    return hashlib.sha1(",".join(str(int(t)) for t in ids).encode()).hexdigest()[:16]


def _as_version_1(root: Path) -> None:
    """Rewrite a training log as an older msprobe-hooks wrote it: first-definition hashes, no version field."""
    (log,) = root.glob("*/update_actor_log.jsonl")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for line, sample in zip(lines, SAMPLES, strict=True):
        del line["prompt_hash_version"]
        line["samples"][0]["prompt_hash"] = _v1_hash(sample.prompt)
    log.write_text("".join(compact(line) + "\n" for line in lines))


def test_prompt_hashes_join_only_within_one_definition(training, gen, tmp_path, align):
    old = tmp_path / "train"
    shutil.copytree(training, old)
    _as_version_1(old)
    assert [train_lines(old)[n]["samples"][0]["prompt_hash"] for n in range(2)] != [
        train_lines(training)[n]["samples"][0]["prompt_hash"] for n in range(2)
    ]
    for n, sample in enumerate(SAMPLES):  # an engine that gives no request id: the hash is the only key
        gen.step(n, [full_prefill(sample, request_id=None)])
    status, stdout, _, found = align(training, gen.root, tmp_path / "new.jsonl")
    assert status == 0 and [p["rule"] for p in found] == ["prompt_hash"] * len(SAMPLES)
    # An older training log against today's dispatch log: equal prompts, hashes of two definitions. Never a
    # match by accident: nothing pairs, each counted as having no counterpart.
    status, stdout, _, found = align(old, gen.root, tmp_path / "mixed.jsonl")
    assert found == [] and table(stdout)["no counterpart"][0] == len(SAMPLES)
    # Both logs from before the version: the first definition still joins them.
    older = tmp_path / "older"
    for n, sample in enumerate(SAMPLES):
        record = step_record(engine="vllm", engine_version="0.32.0", rank=0, step=n, dumped=True, requests=[
            full_prefill(sample, request_id=None)._replace(prompt_hash=_v1_hash(sample.prompt))
        ])  # fmt: skip
        del record["prompt_hash_version"]
        GenTree(older, gen.dumps).line(record)
        GenTree(older, gen.dumps).copy_dump(len(sample.prompt), GEN_PID, n, 0)
    status, stdout, _, found = align(old, older, tmp_path / "old.jsonl")
    assert [(p["rule"], p["key"]) for p in found] == [("prompt_hash", _v1_hash(s.prompt)) for s in SAMPLES]


def test_equal_prompts_are_ambiguous_never_paired(training, gen, tmp_path, align):
    # Sample 0's prompt twice without ids (two requests on one rank); sample 1's under another id.
    gen.step(0, [full_prefill(SAMPLES[0], request_id=None)])
    gen.step(1, [full_prefill(SAMPLES[0], request_id=None)])
    gen.step(2, [full_prefill(SAMPLES[1], request_id="someone-else" + SUFFIX)])
    gen.step(3, [full_prefill(SAMPLES[2], request_id=None)])
    status, out, err, found = align(training, gen.root, tmp_path / "pairs.jsonl")
    assert status == 0, err
    assert keys(found) == [("prompt_hash", f"{prompt_hash(SAMPLES[2].prompt)}/v2", 2, 3, 0)]
    assert table(out) == {"ambiguous hash": (2, 3), "no counterpart": (1, 0)}


# --- which inference steps pair ----------------------------------------------------------------


def test_packed_prefill_pairs_only_when_msprobe_cut_it_to_one_request(training, gen, tmp_path, align):
    gen.step(0, [full_prefill(SAMPLES[0]), full_prefill(SAMPLES[1])])  # 12 tokens dumped: both prompts
    gen.step(1, [decode(SAMPLES[0]), full_prefill(SAMPLES[2])], dump_tokens=4)  # cut to sample 2's 4 tokens
    # Sample 3 prefilled twice (preempted, recomputed): cut from a packed step, then alone; alone wins.
    gen.step(2, [decode(SAMPLES[0], 1), full_prefill(SAMPLES[3])], dump_tokens=6)
    gen.step(3, [full_prefill(SAMPLES[3])])
    status, out, err, found = align(training, gen.root, tmp_path / "pairs.jsonl")
    assert status == 0, err
    assert keys(found) == [("request_id", "req-uid-2", 2, 1, 0), ("request_id", "req-uid-3", 3, 3, 0)]
    assert found[0]["generate"]["filtered"] is True and found[0]["generate"]["offset"] == 1
    assert found[0]["generate"]["num_requests"] == 2
    assert found[1]["generate"]["filtered"] is False
    assert table(out) == {"multi-request step": (2, 1), "replica": (0, 1)}


def test_generate_config_request_id_marks_the_cut_step(training, gen, tmp_path, align):
    # Sample 3's prompt (6 tokens) packed with another 6-token prompt: the dump's count cannot tell them apart.
    other = ScheduledRequest("other" + SUFFIX, "other", True, 6, 0, 6, prompt_hash([9] * 6))
    gen.step(0, [other, full_prefill(SAMPLES[3])], dump_tokens=6)
    status, out, err, found = align(training, gen.root, tmp_path / "pairs.jsonl")
    assert status == 1 and found == []
    assert table(out)["multi-request step"] == (1, 1)
    assert "nothing paired" in err
    config = tmp_path / "generate_config.json"
    config.write_text(json.dumps({"task": "statistics", "statistics": {"request_id": "req-uid-3"}}))
    status, out, err, found = align(training, gen.root, tmp_path / "pairs.jsonl", "--generate-config", str(config))
    assert status == 0, err
    assert keys(found) == [("request_id", "req-uid-3", 3, 0, 0)] and found[0]["generate"]["filtered"] is True


def test_unpaired_reasons_decode_only_not_dumped_partial_no_counterpart(training, gen, tmp_path, align):
    s0, s1, s2, _ = SAMPLES
    gen.step(0, [decode(s0)])  # sample 0: its prefill is not in the log
    gen.step(1, [full_prefill(s1)], dumped=False)  # sample 1: msprobe's step filter skipped its prefill
    n = len(s2.prompt)
    chunk = ScheduledRequest(s2.request_id + SUFFIX, s2.request_id, True, 2, 0, n, prompt_hash(s2.prompt))
    gen.step(2, [chunk])  # sample 2: chunked prefill
    gen.step(3, [full_prefill(verl_cpu.Sample(prompt=(5,) * 7, response=(), uid="x", request_id="stranger"))])
    # sample 3: nothing at all
    status, out, err, found = align(training, gen.root, tmp_path / "pairs.jsonl")
    assert status == 1 and found == []
    assert table(out) == {
        "decode only": (1, 1),
        "not a full prefill": (1, 1),
        "not dumped": (1, 0),
        "no counterpart": (1, 1),
    }
    why = "of 4 training dumps: 1 decode only, 1 not dumped, 1 not a full prefill, 1 no counterpart"
    assert f"nothing paired ({why})" in err
    assert (tmp_path / "pairs.jsonl").read_text() == ""  # a stale pairs file is never left behind


# --- ranks ---------------------------------------------------------------------------------------


def two_rank_training(training: Path, folder: Path) -> Path:
    """The same dumps as a 2-card FSDP run writes them: rank 0 got samples 0, 1; rank 1 samples 2, 3.

    Each rank's process has its own log and its own msprobe step counter.
    """
    root = folder / "actor"
    lines = train_lines(training)
    for rank, pid in ((0, 100), (1, 101)):
        mine = lines[2 * rank : 2 * rank + 2]
        log = root / str(pid) / "update_actor_log.jsonl"
        log.parent.mkdir(parents=True)
        for step, line in enumerate(mine):
            shutil.copytree(training / f"step{line['step']}" / "rank0", root / f"step{step}" / f"rank{rank}")
            line.update(pid=pid, rank=rank, step=step)
        log.write_text("".join(json.dumps(line) + "\n" for line in mine))
    return root


def test_ranks_fsdp_and_megatron(training, gen, tmp_path, align):
    train = two_rank_training(training, tmp_path)
    # Generate TP = 2 cards: both TP workers log (and dump) every prefill.
    for pid, rank in ((500, 0), (501, 1)):
        for n, sample in enumerate(SAMPLES):
            gen.step(n, [full_prefill(sample)], pid=pid, rank=rank)
    status, out, err, found = align(train, gen.root, tmp_path / "pairs.jsonl")
    assert status == 0, err
    # One engine at TP 2 (FSDP): each sample with every rank of it, the lowest first; no copy left unpaired.
    assert [(p["key"], p["train"]["rank"], p["generate"]["rank"], p["generate"]["pid"]) for p in found] == [
        ("req-uid-0", 0, 0, 500),
        ("req-uid-1", 0, 0, 500),
        ("req-uid-2", 1, 0, 500),
        ("req-uid-3", 1, 0, 500),
    ]
    assert {p["rank_rule"] for p in found} == {"all_ranks"}
    assert {tuple((s["rank"], s["pid"]) for s in p["generate"]["shards"]) for p in found} == {((0, 500), (1, 501))}
    assert table(out) == {}

    # Generate TP = 1 on a 2-card FSDP job: rank 1's samples were prefilled by rank 0.
    shutil.rmtree(gen.root / "501")
    status, out, err, found = align(train, gen.root, tmp_path / "pairs.jsonl")
    assert status == 0, err
    assert [(p["train"]["rank"], p["generate"]["rank"], p["rank_rule"]) for p in found] == [
        (0, 0, "same"),
        (0, 0, "same"),
        (1, 0, "fsdp_any"),
        (1, 0, "fsdp_any"),
    ]
    # Megatron's shards line up only rank to rank.
    status, out, err, found = align(train, gen.root, tmp_path / "pairs.jsonl", "--backend", "megatron")
    assert status == 0, err
    assert [p["train"]["rank"] for p in found] == [0, 0]
    assert table(out) == {"other ranks only": (2, 2)}


# --- the published recipe's logs --------------------------------------------------------------


def test_recipe_logs_collected_by_hand(training, gen, tmp_path, align):
    """Lines as the recipe's engine patch and DispatchLogger write them (fields of recipe.md §4.9, §6)."""
    train = tmp_path / "actor"
    recipe_lines = []
    for line in train_lines(training):
        shutil.copytree(training / f"step{line['step']}", train / f"step{line['step']}")
        ids = [line["samples"][0]["request_id"]]
        recipe_lines.append({"source": "update_actor", "timestamp": "2026-05-13T10:00:01", "pid": 77, "rank": 0})
        recipe_lines[-1].update(step=line["step"], request_ids=ids, num_requests=1)
    recipe_lines[3]["inference_request_ids"] = recipe_lines[3].pop("request_ids")  # Fully Async's name
    (train / "77").mkdir()
    (train / "77" / "update_actor_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recipe_lines))

    def dispatch(step: int, phase: str, rows: list[dict], dump_tokens: int | None) -> None:
        total = sum(r.get("tokens", r.get("num_tokens", 0)) for r in rows)
        gen.line(
            {"source": "dispatch_logger", "timestamp": "2026-05-13T10:00:00", "pid": 88, "rank": 0, "step": step}
            | {"phase": phase, "total_num_scheduled_tokens": total, "requests": rows},
            pid=88,
        )
        if dump_tokens is not None:
            gen.copy_dump(dump_tokens, 88, step, 0)

    s0, s1, s2, s3 = SAMPLES
    dispatch(0, "prefill", [{"request_id": s0.request_id + SUFFIX, "type": "new", "tokens": 5}], 5)
    dispatch(1, "decode", [{"request_id": s0.request_id + SUFFIX, "type": "cached", "tokens": 1}], 1)
    # Sample 1's prompt has 7 tokens: a 6-token step is not its whole prompt (the dump shows it).
    dispatch(2, "prefill", [{"request_id": s1.request_id + SUFFIX, "type": "new", "tokens": 6}], 6)
    dispatch(3, "prefill", [{"req_id": s2.request_id + SUFFIX, "type": "new", "num_tokens": 4}], 4)  # other names
    dispatch(4, "prefill", [{"request_id": s3.request_id + SUFFIX, "type": "new", "tokens": 6}], 6)
    status, out, err, found = align(train, gen.root, tmp_path / "pairs.jsonl")
    assert status == 0, err
    assert keys(found) == [
        ("request_id", "req-uid-0", 0, 0, 0),
        ("request_id", "req-uid-2", 2, 3, 0),
        ("request_id", "req-uid-3", 3, 4, 0),
    ]
    assert found[0]["prompt_len"] == 5 and found[0]["train"]["format"] == "recipe"
    assert found[0]["generate"]["format"] == "recipe" and found[0]["generate"]["engine"] is None
    assert table(out) == {"decode only": (0, 1), "not a full prefill": (1, 1)}


# --- damage ----------------------------------------------------------------------------------


def test_bad_lines_and_missing_dumps_are_named_and_the_rest_paired(training, gen, tmp_path, align):
    train = tmp_path / "actor"
    shutil.copytree(training, train)
    (log,) = train.glob("*/update_actor_log.jsonl")
    lines = log.read_text().splitlines()
    lines.insert(1, "this is not json")
    log.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:40])  # the last line cut off mid-record
    for n, sample in enumerate(SAMPLES):
        gen.step(n, [full_prefill(sample)], dump_tokens=None if n == 2 else -1)  # step 2's dump.json is gone
    gen.line('{"step": 9, "requests": [')
    corrupt = gen.root / str(GEN_PID) / "step1" / "rank0" / "dump.json"
    corrupt.write_text("<html>proxy error</html>")
    status, out, err, found = align(train, gen.root, tmp_path / "pairs.jsonl")
    assert status == 0, err
    assert [p["key"] for p in found] == ["req-uid-0"]
    assert f"{corrupt}: not an msprobe dump.json" in err
    assert f"{log}:2: not JSON" in err
    assert f"{log}:5: not JSON (truncated?)" in err
    gen_log = gen.root / str(GEN_PID) / "dispatch_log.jsonl"
    assert f"{gen_log}:5: not JSON" in err
    missing = gen.root / str(GEN_PID) / "step2" / "rank0" / "dump.json"
    assert f"{missing}: missing" in err
    # The cut line's dump is then listed by no line: named too, not paired.
    cut = train / f"step{json.loads(lines[-1])['step']}" / "rank0" / "dump.json"
    assert f"1 training dump(s) that no training log line lists: {cut}; the process writing them stopped" in err
    assert table(out) == {"dump unreadable": (2, 2), "no counterpart": (0, 1)}
    assert "6 bad log lines or dump files" in out


def test_a_training_dump_no_line_lists_is_named_and_never_paired(training, gen, tmp_path, align):
    # A worker killed while dumping: msprobe's start() wrote the step folder's empty dump.json, our line never came.
    train = tmp_path / "actor"
    shutil.copytree(training, train)
    orphan = train / "step9" / "rank0" / "dump.json"
    orphan.parent.mkdir(parents=True)
    orphan.write_text(json.dumps({"task": "statistics", "level": "L0", "framework": "pytorch", "data": {}}))
    for n, sample in enumerate(SAMPLES):
        gen.step(n, [full_prefill(sample)])
    status, out, err, found = align(train, gen.root, tmp_path / "pairs.jsonl")
    assert status == 0, err
    assert [p["key"] for p in found] == [f"req-uid-{n}" for n in range(len(SAMPLES))]  # the rest, as before
    assert f"1 training dump(s) that no training log line lists: {orphan}; " in err
    assert "1 bad log lines or dump files" in out


def test_a_missing_training_dump_leaves_its_prefill_unpaired(training, gen, tmp_path, align):
    train = tmp_path / "actor"
    shutil.copytree(training, train)
    (train / "step1" / "rank0" / "dump.json").unlink()
    for n, sample in enumerate(SAMPLES):
        gen.step(n, [full_prefill(sample)])
    status, out, err, found = align(train, gen.root, tmp_path / "pairs.jsonl")
    assert status == 0, err
    assert [p["key"] for p in found] == ["req-uid-0", "req-uid-2", "req-uid-3"]
    assert f"{train / 'step1' / 'rank0' / 'dump.json'}: missing" in err
    assert table(out) == {"dump unreadable": (1, 1)}


def test_two_processes_writing_one_rank_are_named_and_their_folders_never_paired(training, gen, tmp_path, align):
    # A second job on the same dump root (or a second process that also took rank 0) wrote step0/rank0 and
    # step1/rank0 over the first one's: msprobe names the folders by rank only.
    train = tmp_path / "actor"
    shutil.copytree(training, train)
    (log,) = train.glob("*/update_actor_log.jsonl")
    other = train / "99999" / log.name
    other.parent.mkdir()
    other.write_text(
        "".join(json.dumps({**json.loads(line), "pid": 99999}) + "\n" for line in log.read_text().splitlines()[:2])
    )
    for n, sample in enumerate(SAMPLES):
        gen.step(n, [full_prefill(sample)])
    status, out, err, found = align(train, gen.root, tmp_path / "pairs.jsonl")
    assert status == 0, err
    assert [p["key"] for p in found] == ["req-uid-2", "req-uid-3"]  # the folders one process alone wrote
    first_pid = json.loads(log.read_text().splitlines()[0])["pid"]
    (named,) = [line for line in err.splitlines() if "written by 2 processes" in line]
    assert f"pid {first_pid} ({log})" in named and f"pid 99999 ({other})" in named
    assert (
        str(train / "step0" / "rank0" / "dump.json") in named and str(train / "step1" / "rank0" / "dump.json") in named
    )
    assert table(out)["written by two processes"] == (4, 0)


def test_pairs_paths_relative_to_the_pairs_file_resolve_after_a_move(training, gen, tmp_path, align):
    job = tmp_path / "job"
    shutil.copytree(training, job / "actor")
    gen.root = job / "generate"
    gen.step(0, [full_prefill(SAMPLES[0])])
    status, _, err, found = align(job / "actor", gen.root, job / "pairs.jsonl")
    assert status == 0, err
    written = json.loads((job / "pairs.jsonl").read_text())
    assert written["train"]["dump"] == "actor/step0/rank0/dump.json"
    assert written["generate"]["dump"] == f"generate/{GEN_PID}/step0/rank0/dump.json"
    moved = tmp_path / "moved"
    job.rename(moved)
    (pair,) = raw_pairs(moved / "pairs.jsonl")
    assert pair["train"]["dump"] == str(moved / "actor/step0/rank0/dump.json") and Path(pair["train"]["dump"]).is_file()
    assert Path(pair["generate"]["dump"]).is_file()
    # A pairs file elsewhere names the dumps by absolute path.
    status, _, err, found = align(moved / "actor", moved / "generate", tmp_path / "elsewhere" / "pairs.jsonl")
    assert status == 0, err
    assert json.loads((tmp_path / "elsewhere" / "pairs.jsonl").read_text())["train"]["dump"].startswith("/")


def test_bad_input_exits_2_and_names_it(training, tmp_path, align):
    status, _, err, _ = align(training, tmp_path / "nowhere", tmp_path / "pairs.jsonl")
    assert status == 2 and f"GENERATE_DIR {str(tmp_path / 'nowhere')!r} is not a directory" in err
    (tmp_path / "empty").mkdir()
    status, _, err, _ = align(training, tmp_path / "empty", tmp_path / "pairs.jsonl")
    assert status == 2 and "holds no {pid}/dispatch_log.jsonl" in err
    status, _, err, _ = align(tmp_path / "empty", training, tmp_path / "pairs.jsonl")
    assert status == 2 and "holds no {pid}/update_actor_log.jsonl" in err
    gen = tmp_path / "generate" / "1"
    gen.mkdir(parents=True)
    (gen / "dispatch_log.jsonl").write_text("")
    (tmp_path / "config.json").write_text("{not json")
    options = ("--generate-config", str(tmp_path / "config.json"))
    status, _, err, _ = align(training, tmp_path / "generate", tmp_path / "pairs.jsonl", *options)
    assert status == 2 and f"--generate-config {tmp_path / 'config.json'}: not JSON" in err


def test_decode_lines_read_without_json_agree_with_json(tmp_path):
    """Our undumped decode-only lines are scanned, not parsed (most lines of a long log): the same answer. A
    dumped one is read whole: a decode pair needs its rows (offset, computed tokens)."""
    odd = verl_cpu.Sample(prompt=(3, 4), response=(), uid="x", request_id='quote"and\\slash')
    records = [
        step_record(engine="sglang", engine_version=None, rank=1, step=n, dumped=dumped, requests=rows)
        for n, (dumped, rows) in enumerate(
            [
                (True, [decode(s) for s in SAMPLES]),
                (False, [decode(SAMPLES[0]), decode(odd)]),
                (True, []),
                (True, [full_prefill(SAMPLES[1]), decode(SAMPLES[0])]),  # a prefill row: parsed
            ]
        )
    ]
    compact_log, spaced_log = tmp_path / "compact.jsonl", tmp_path / "spaced.jsonl"
    compact_log.write_text("".join(compact(r) + "\n" for r in records))
    spaced_log.write_text("".join(json.dumps(r) + "\n" for r in records))
    scanned = list(logs.read_dispatch(str(compact_log), pytest.fail))
    parsed = list(logs.read_dispatch(str(spaced_log), pytest.fail))
    assert [logs._decode_line(compact(r)) is not None for r in records] == [False, True, False, False]
    assert (
        scanned[1]
        == parsed[1]
        == logs.DecodeStep(
            False,
            ["req-uid-0", 'quote"and\\slash'],
            [versioned_hash(prompt_hash(s.prompt), PROMPT_HASH_VERSION) for s in (SAMPLES[0], odd)],
        )
    )
    for read, whole in zip([scanned[i] for i in (0, 2, 3)], [parsed[i] for i in (0, 2, 3)], strict=True):
        assert isinstance(read, logs.GenerateStep) and read.rows == whole.rows and read.dumped is True
    assert [row.computed for row in scanned[0].rows] == [len(s.prompt) for s in SAMPLES]  # decode: after the prompt


def test_embedding_token_count_streams_any_dump(training, embedding_dumps, tmp_path):
    from msprobe_hooks.analysis import dumpfile

    assert dumpfile.embedding_tokens(str(training / "step1" / "rank0" / "dump.json")) == 7  # [1, 7], level mix
    assert dumpfile.embedding_tokens(str(embedding_dumps[12] / "dump.json")) == 12  # [12], level L0
    real = json.loads((embedding_dumps[6] / "dump.json").read_text())
    (entry,) = [value for name, value in real["data"].items() if ".embed_tokens." in name]
    # Megatron's name, behind ~300 KB of other entries, placed so that the reader's chunk boundary
    # cuts the name itself, then the value.
    name = "Module.module.module.embedding.word_embeddings.VocabParallelEmbedding.forward.0"
    filler = {f"Functional.linear.{i}.forward": {"input_args": [], "output": [{"pad": "x" * 300}]} for i in range(1000)}
    big = tmp_path / "dump.json"
    for before_boundary in (20, 120):
        first = filler["Functional.linear.0.forward"]["output"][0]
        first["pad"] = "x" * 300
        real["data"] = {**filler, name: entry}
        start = json.dumps(real, indent=1).index(f'"{name}"')
        first["pad"] += "x" * ((-start - before_boundary) % dumpfile.EMBEDDING_CHUNK)
        text = json.dumps(real, indent=1)
        assert text.index(f'"{name}"') % dumpfile.EMBEDDING_CHUNK == dumpfile.EMBEDDING_CHUNK - before_boundary
        big.write_text(text)
        assert dumpfile.embedding_tokens(str(big)) == 6
    cut = tmp_path / "cut.json"
    cut.write_text(big.read_text()[: big.stat().st_size - 200])
    with pytest.raises(dumpfile.DumpFileError, match="cut.json: .*truncated"):
        dumpfile.embedding_tokens(str(cut))
    real["data"] = filler
    big.write_text(json.dumps(real, indent=1))
    assert dumpfile.embedding_tokens(str(big)) is None


def test_the_dump_probe_reads_a_dump_once_and_names_a_bad_one_once(embedding_dumps, tmp_path, monkeypatch):
    from msprobe_hooks.analysis import dumpfile

    reads = []
    read = dumpfile.embedding_tokens
    monkeypatch.setattr(dumpfile, "embedding_tokens", lambda path: reads.append(path) or read(path))
    warned = []
    probe = dumpfile.DumpProbe(warned.append)
    good, bad = str(embedding_dumps[5] / "dump.json"), tmp_path / "dump.json"
    bad.write_text("<html>proxy error</html>")
    assert probe.readable(good) and probe.tokens(good) == 5 and probe.tokens(good) == 5 and reads == [good]
    assert not probe.readable(str(bad)) and not probe.readable(str(bad)) and probe.tokens(str(bad)) is None
    assert probe.failed(str(bad)) and not probe.failed(good)
    assert warned == [f"{bad}: not an msprobe dump.json (expected a JSON object)"]
