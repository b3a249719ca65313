"""The real SGLang engine (sglang 0.5.21, CPU, ``.venv-sglang``): the dispatch log beside SGLang's own dumps.

One scenario, run by two engines (each start costs ~14 s): SGLang's own msprobe switch
(``msprobe_dump_config``, 0.5.11+) on in both, the hooks off (the baseline) and on (``DUMP_ON=1``,
with a ``MSPROBE_GENERATE_CONFIG`` too, which SGLang's switch overrides).
Wave 0 sends two prompts in one ``generate`` call (one EXTEND holding both, then DECODEs); wave 1
sends a prompt that starts with wave 0's first prompt, so its EXTEND finds that prefix in the
radix cache. The model runs in SGLang's scheduler, a spawned process. No CUDA graph can run here
and 0.5.14+ turns graphs off itself under msprobe, so there is no graph-mode refusal to test on
this version. The stand-in tests (``test_sglang_*.py``) keep what cannot run here: the versions
below 0.5.11, where we make the debugger, and 0.5.11-0.5.13's graph checks.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from support.doctor_output import SPAWN_CHECKS_WITHOUT_RAY, doctor_patches, spawn_checks
from support.interpreter import clean_env, run_python
from support.real_sglang import KERNEL_STUB, EngineRun, engine_env, run_engine, sglang_bin, tokenizer_dir
from support.sglang_standin import dispatch_log, dumped_modules, step_folders

from cpu_kit import verl_cpu
from msprobe_hooks.join_keys import ENGINE_LOG, REQUESTS_LOG, prompt_hash
from msprobe_hooks.numerics import TEMPERATURE_SCALED_LOGPROBS, config_fields

pytestmark = pytest.mark.engine  # runs a real engine (make test-fast leaves it out)

PROMPTS = {"req-a": [5, 6, 7, 8], "req-b": [9, 10, 11], "req-c": [5, 6, 7, 20, 21]}
MAX_NEW_TOKENS = {"req-a": 3, "req-b": 3, "req-c": 2}
WAVES = [
    [{"id": rid, "prompt": PROMPTS[rid], "max_new_tokens": MAX_NEW_TOKENS[rid]} for rid in wave]
    for wave in (["req-a", "req-b"], ["req-c"])
]
# The dump_path of the MSPROBE_GENERATE_CONFIG set beside SGLang's switch: never written.
GENERATE_DUMP = "generate-dump"
# Left out by msprobe's step filter: its line must say dumped false and it has no folder (wave 0's first decode).
UNDUMPED_STEP = 1
# What SGLang 0.5.21 resolves on this CPU box for the child's engine (engine.jsonl).
REAL_ATTENTION_BACKEND = "torch_native"
REAL_CHUNKED_PREFILL = True
EMBEDDING_INPUT = "Module.model.embed_tokens.VocabParallelEmbedding.forward.0.input.0.pt"


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    model = Path(verl_cpu.build_model_dir(str(tmp_path_factory.mktemp("model"))))
    return str(model), str(tokenizer_dir(model, tmp_path_factory.mktemp("tokenizer")))


def _msprobe_config(path: Path, dump_path: Path) -> Path:
    """Task ``tensor`` (the rows are checked against the dumped embedding input), every step but one."""
    steps = [step for step in range(64) if step != UNDUMPED_STEP]
    config = {"task": "tensor", "level": "L0", "rank": [], "step": steps, "dump_path": str(dump_path)}
    path.write_text(json.dumps(config))
    return path


def _run(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    model_dirs: tuple[str, str],
    generate_config: bool = False,
    **env: str,
) -> EngineRun:
    work = tmp_path_factory.mktemp(name)
    native = _msprobe_config(work / "native.json", work / "dump")  # SGLang's own switch
    if generate_config:  # a MSPROBE_GENERATE_CONFIG beside it, as a job may set both: SGLang's wins
        env["MSPROBE_GENERATE_CONFIG"] = str(_msprobe_config(work / "generate.json", work / GENERATE_DUMP))
    model, tokenizer = model_dirs
    scenario = {"model": model, "tokenizer": tokenizer, "engine": {"msprobe_dump_config": str(native)}, "waves": WAVES}
    run = run_engine(work, scenario, **env)
    assert run.returncode == 0, run.stderr[-4000:]
    return run


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, model_dirs) -> EngineRun:
    return _run(tmp_path_factory, "baseline", model_dirs)


@pytest.fixture(scope="module")
def hooked(tmp_path_factory, model_dirs) -> EngineRun:
    return _run(tmp_path_factory, "hooked", model_dirs, generate_config=True, DUMP_ON="1")


def _scheduler_pid(run: EngineRun) -> int:
    """The one process that dumped: SGLang's scheduler, not the driving process."""
    (folder,) = (run.work / "dump").iterdir()
    assert folder.name != str(run.report["pid"])
    return int(folder.name)


def _embedding_input(run: EngineRun, pid: int, step: int) -> list[int]:
    (rank_dir,) = (run.work / "dump" / str(pid) / f"step{step}").iterdir()
    return torch.load(rank_dir / "dump_tensor_data" / EMBEDDING_INPUT).tolist()


def test_outputs_unchanged_by_the_hooks(baseline, hooked):
    assert hooked.outputs == baseline.outputs
    assert {rid: len(ids) for rid, ids in hooked.outputs.items()} == MAX_NEW_TOKENS


def test_sglang_dumps_by_itself_without_the_hooks(baseline):
    """The baseline: SGLang's switch writes step{N} straight under dump_path, and there is no log of ours."""
    root = baseline.work / "dump"
    assert all(p.name.startswith("step") for p in root.iterdir())
    assert "[msprobe-hooks" not in baseline.stderr


def test_native_switch_stays_in_charge_with_dumps_per_process(hooked):
    """DUMP_ON=1: SGLang's own debugger still dumps every forward; we only move it under {dump_path}/{pid}."""
    pid = _scheduler_pid(hooked)
    lines = dispatch_log(hooked.work / "dump", pid)
    assert [line["step"] for line in lines] == list(range(len(lines)))
    # SGLang's switch dumps decodes too; msprobe's step filter leaves one step out.
    assert [line["dumped"] for line in lines] == [line["step"] != UNDUMPED_STEP for line in lines]
    assert step_folders(hooked.work / "dump", pid) == {line["step"]: ["rank0"] for line in lines if line["dumped"]}
    assert all(line["rank"] == 0 for line in lines)
    assert "Module.model.layers.1.mlp.Qwen2MLP.forward.0" in dumped_modules(hooked.work / "dump", pid, 0)
    ours = [line for line in hooked.stderr.splitlines() if line.startswith("[msprobe-hooks")]
    # No warning: SGLang's switch is on, so MSPROBE_GENERATE_CONFIG is not left unused (nor dumped to).
    assert ours and all(" INFO " in line for line in ours), "\n".join(ours)
    assert not (hooked.work / GENERATE_DUMP).exists()
    assert f"[msprobe-hooks {pid}] INFO applied patch sglang.model_runner to sglang 0.5.21" in ours


def test_one_line_per_forward_with_its_requests(hooked):
    """Per ModelRunner.forward: the published fields, the client's request ids, prompt lengths and hashes,
    and rows that slice the forward's dumped input at each request's tokens."""
    pid = _scheduler_pid(hooked)
    lines = dispatch_log(hooked.work / "dump", pid)
    assert {(line["source"], line["engine"], line["engine_version"], line["pid"]) for line in lines} == {
        ("dispatch_logger", "sglang", "0.5.21", pid)
    }
    assert {line["phase"] for line in lines} == {"prefill", "decode"}
    assert all(line["forward_mode"] == ("EXTEND" if line["phase"] == "prefill" else "DECODE") for line in lines)
    prefills = [line for line in lines if line["phase"] == "prefill"]
    assert [[r["request_id"] for r in line["requests"]] for line in prefills] == [["req-a", "req-b"], ["req-c"]]
    for line in lines:
        rows = line["requests"]
        assert line["num_requests"] == len(rows)
        assert line["total_num_scheduled_tokens"] == sum(r["tokens"] for r in rows)
        assert [r["offset"] for r in rows] == [sum(r["tokens"] for r in rows[:i]) for i in range(len(rows))]
        for row in rows:
            prompt = PROMPTS[row["request_id"]]
            assert row["request_id_base"] == row["request_id"]  # SGLang keeps the client's id as sent
            assert (row["prompt_len"], row["prompt_hash"]) == (len(prompt), prompt_hash(prompt))
        # What the embedding of that forward took in: each row is its request's tokens (prompt, then
        # generated) from the cached ones on.
        if not line["dumped"]:
            continue
        tokens = _embedding_input(hooked, pid, line["step"])
        assert len(tokens) == line["total_num_scheduled_tokens"]
        for row in rows:
            sequence = PROMPTS[row["request_id"]] + hooked.outputs[row["request_id"]]
            done = row["computed_tokens"]
            assert tokens[row["offset"] : row["offset"] + row["tokens"]] == sequence[done : done + row["tokens"]]


def test_full_prefill_rows(hooked):
    """Wave 0's prompts are prefilled whole; req-c finds req-a's first three tokens in the radix cache."""
    lines = dispatch_log(hooked.work / "dump", _scheduler_pid(hooked))
    rows = [
        (r["request_id"], r["type"], r["tokens"], r["computed_tokens"], r["full_prefill"])
        for line in lines
        if line["phase"] == "prefill"
        for r in line["requests"]
    ]
    assert rows == [("req-a", "new", 4, 0, True), ("req-b", "new", 3, 0, True), ("req-c", "new", 2, 3, False)]
    decode_rows = [r for line in lines if line["phase"] == "decode" for r in line["requests"]]
    assert decode_rows and not any(r["prefill"] or r["full_prefill"] for r in decode_rows)
    assert all(r["type"] == "cached" and r["tokens"] == 1 for r in decode_rows)


def _evidence(run: EngineRun, name: str) -> list[dict]:
    path = run.work / "dump" / str(_scheduler_pid(run)) / name
    assert path.is_file(), f"{path} is missing"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_engine_line_has_the_engines_real_settings(hooked, model_dirs):
    """engine.jsonl beside the dispatch log, once: what the scheduler's ModelRunner runs, read from SGLang's objects
    (the child's engine: float32, no CUDA graph, radix cache on; SGLang's default temperature-scaled log-probs)."""
    (line,) = _evidence(hooked, ENGINE_LOG)
    assert (line["side"], line["engine"], line["version"], line["pid"]) == (
        "generate",
        "sglang",
        "0.5.21",
        _scheduler_pid(hooked),
    )
    checkpoint = json.loads((Path(model_dirs[0]) / "config.json").read_text())
    assert line["numerics"] == {
        "model_dtype": "float32",
        "kv_cache_dtype": "float32",  # auto: the model's
        "head_dtype": "float32",
        "attention_backend": REAL_ATTENTION_BACKEND,
        "tensor_parallel": 1,
        "pipeline_parallel": 1,
        "expert_parallel": 1,
        "prefix_caching": True,
        "chunked_prefill": REAL_CHUNKED_PREFILL,
        "eager": True,
        "quantization": None,
        "logprobs_mode": TEMPERATURE_SCALED_LOGPROBS,
        "max_model_len": checkpoint["max_position_embeddings"],
    }
    fields = config_fields(checkpoint)
    assert line["model_config"]["rope_theta"] == fields["rope_theta"]
    assert line["model_config"]["rope_theta_source"] == "rotary module"  # read off the loaded model
    for key in ("model_type", "rms_norm_eps", "tie_word_embeddings", "hidden_size", "num_hidden_layers"):
        assert line["model_config"][key] == fields[key]
    assert line["model_config_fingerprint"].startswith("cfg-v1:")
    assert "could not read" not in hooked.stderr


def test_one_request_line_per_request_as_sglang_holds_it(hooked):
    """requests.jsonl: each request once, in the forward that first holds it, with SGLang's SamplingParams (the
    child's greedy temperature 0 is held as temperature 1 and top_k 1) and the prompt ids it was fed."""
    lines = _evidence(hooked, REQUESTS_LOG)
    assert [(r["request_id"], r["base"], r["prompt_len"], r["prompt_token_ids"]) for r in lines] == [
        (rid, rid, len(PROMPTS[rid]), PROMPTS[rid]) for rid in ("req-a", "req-b", "req-c")
    ]
    assert {json.dumps(r["sampling"], sort_keys=True) for r in lines} == {
        json.dumps(
            {
                "temperature": 1.0,
                "top_k": 1,
                "top_p": 1.0,
                "min_p": 0.0,
                "presence_penalty": 0.0,
                "frequency_penalty": 0.0,
                "repetition_penalty": 1.0,
                "logprobs": None,
                "seed": None,
            },
            sort_keys=True,
        )
    }


def _doctor(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    command = [str(sglang_bin("msprobe-hooks")), "doctor", *args]
    return subprocess.run(
        command, env=engine_env(DUMP_ON="1"), cwd=tmp_path, capture_output=True, text=True, timeout=300
    )


def test_doctor_in_the_sglang_env(tmp_path):
    done = _doctor(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    patches = doctor_patches(done.stdout)
    for name in ("sglang.model_runner", "sglang.forward_batch", "sglang.schedule_batch"):
        assert patches[name] == "eligible (sglang 0.5.21)"
    assert patches["verl.fsdp_engine"] == "verl not installed"  # the inference venv has no verl
    assert "  mindstudio-probe 26.2.0 (supported)" in done.stdout.splitlines()
    assert "  ran in this process: yes" in done.stdout.splitlines()


def test_doctor_spawn_check_in_the_sglang_env(tmp_path):
    """SGLang spawns its scheduler: a spawned child of this venv activates from the environment."""
    done = _doctor(tmp_path, "--spawn-check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert spawn_checks(done.stdout) == SPAWN_CHECKS_WITHOUT_RAY
    assert "ray task   skipped: ray is not installed" in done.stdout


def test_kernel_stub_raises_when_called_and_has_no_submodules():
    """The stub only lets SGLang import: a kernel reached at run time fails loudly, submodules stay missing."""
    code = """
        import importlib, json
        import sgl_kernel
        try:
            sgl_kernel.copy_all_layer_kv_cache_cpu(1, 2)
            called = "returned"
        except NotImplementedError as exc:
            called = str(exc)
        try:
            importlib.import_module("sgl_kernel.scalar_type")
            submodule = "imported"
        except ImportError:
            submodule = "ImportError"
        print(json.dumps({"called": called, "submodule": submodule, "has_other": hasattr(sgl_kernel, "silu_and_mul")}))
    """
    result = run_python(code, clean_env(PYTHONPATH=str(KERNEL_STUB)))
    assert result.json() == {
        "called": "sgl_kernel.copy_all_layer_kv_cache_cpu is a test stub: this SGLang run reached a CPU kernel",
        "submodule": "ImportError",
        "has_other": False,
    }
