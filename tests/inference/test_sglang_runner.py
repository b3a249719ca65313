"""SGLang ModelRunner patch: real msprobe dumps and dispatch logs from the SGLang stand-ins.

Every test runs a fresh interpreter with the shim active and one stand-in version on its path;
the stand-ins are checked against the patches' contracts in test_sglang_contract.py.
SGLang 0.5.21 runs for real in test_real_sglang.py; what is here cannot run on this machine's CPU:
the versions below 0.5.11 (our own debugger), graph checks, DP attention, chunked and mixed
batches, injected faults.
"""

from __future__ import annotations

import pytest
from support.interpreter import run_python
from support.sglang_standin import (
    WAVES,
    dispatch_log,
    dumped_modules,
    env_for,
    run_scenario,
    step_folders,
    write_config,
)

from msprobe_hooks.join_keys import prompt_hash

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

MODULES = {
    "Module.embed_tokens.Embedding.forward.0",
    "Module.layers.0.mlp.Linear.forward.0",
    "Module.layers.1.TinyDecoderLayer.forward.0",
    "Module.lm_head.Linear.forward.0",
}


def _rows(line: dict) -> list[tuple]:
    return [
        (r["request_id"], r["type"], r["prefill"], r["tokens"], r["offset"], r["computed_tokens"], r["full_prefill"])
        for r in line["requests"]
    ]


def test_own_dump_of_prefills_through_the_overlap_thread(tmp_path):
    """0.5.2: our debugger dumps the prefill forwards run by the overlap thread; ids come from the scheduler's tag."""
    config = write_config(tmp_path)
    plain = run_scenario("0.5.2", env_for("0.5.2"), server_args={"disable_cuda_graph": True})
    result = run_scenario(
        "0.5.2",
        env_for("0.5.2", DUMP_ON="1", MSPROBE_GENERATE_CONFIG=str(config)),
        server_args={"disable_cuda_graph": True},
    )
    assert result.returncode == 0, result.stderr
    answer = result.json()
    assert answer["overlap_thread"]
    assert answer["outputs"] == plain.json()["outputs"]  # the host's results are untouched
    root = tmp_path / "dump"
    lines = dispatch_log(root, answer["pid"])

    assert [line["step"] for line in lines] == list(range(len(lines)))
    assert [line["phase"] for line in lines] == ["prefill", "prefill", "decode", "decode"]
    assert [line["dumped"] for line in lines] == [True, True, False, False]
    assert step_folders(root, answer["pid"]) == {0: [f"proc{answer['pid']}"], 1: [f"proc{answer['pid']}"]}
    assert dumped_modules(root, answer["pid"], 0) >= MODULES

    first, hit, decode = lines[0], lines[1], lines[2]
    assert (first["engine"], first["engine_version"], first["source"]) == ("sglang", "0.5.2", "dispatch_logger")
    assert first["forward_mode"] == "EXTEND" and first["total_num_scheduled_tokens"] == 7
    assert _rows(first) == [("req-a", "new", True, 4, 0, 0, True), ("req-b", "new", True, 3, 4, 0, True)]
    assert [r["prompt_hash"] for r in first["requests"]] == [prompt_hash(WAVES[0]["req-a"]), prompt_hash([5, 6, 7])]
    assert [r["request_id_base"] for r in first["requests"]] == ["req-a", "req-b"]
    # req-c finds req-a's first three tokens in the radix cache: a prefill, but not a full one.
    assert _rows(hit) == [("req-c", "new", True, 2, 0, 3, False)]
    assert hit["requests"][0]["prompt_len"] == 5 and hit["requests"][0]["prompt_hash"] == prompt_hash([1, 2, 3, 9, 9])
    assert _rows(decode) == [
        ("req-a", "cached", False, 1, 0, 4, False),
        ("req-b", "cached", False, 1, 1, 3, False),
        ("req-c", "cached", False, 1, 2, 5, False),
    ]
    assert not [line for line in result.stderr.splitlines() if "[msprobe-hooks" in line and "INFO" not in line]


def test_dump_all_with_chunks_mixed_batches_and_dp_attention(tmp_path):
    """0.5.10: every forward dumped, into rank{gpu_id} with DP attention; chunk and mixed rows classified."""
    config = write_config(tmp_path)
    env = env_for("0.5.10", DUMP_ON="1", MSPROBE_GENERATE_CONFIG=str(config), MSPROBE_HOOKS_GENERATE_FORWARDS="all")
    server_args = {
        "disable_cuda_graph": True,
        "disable_piecewise_cuda_graph": True,
        "disable_radix_cache": True,
        "enable_mixed_chunk": True,
        "enable_dp_attention": True,
        "dp_size": 2,
    }
    result = run_scenario("0.5.10", env, server_args=server_args, gpu_id=3, chunk_size=3, max_new_tokens=3)
    assert result.returncode == 0, result.stderr
    pid = result.json()["pid"]
    root = tmp_path / "dump"
    lines = dispatch_log(root, pid)

    assert all(line["dumped"] and line["rank"] == 3 for line in lines)
    assert step_folders(root, pid) == {line["step"]: ["rank3"] for line in lines}
    assert [line["phase"] for line in lines] == ["prefill"] * 4 + ["decode"] * 2
    assert [line["prefill_requests"] for line in lines] == [2, 1, 1, 1, 0, 0]
    # req-a (4 tokens) needs two chunks of at most 3: the second is a prefill of a request already seen.
    assert _rows(lines[0]) == [("req-a", "new", True, 3, 0, 0, False), ("req-b", "new", True, 3, 3, 0, True)]
    assert _rows(lines[1]) == [("req-a", "cached", True, 1, 0, 3, False)]
    # req-c's prefill rides with the running requests' decode (radix cache off: no prefix).
    assert lines[2]["forward_mode"] == "MIXED"
    assert _rows(lines[2]) == [
        ("req-c", "new", True, 3, 0, 0, False),
        ("req-a", "cached", False, 1, 3, 4, False),
        ("req-b", "cached", False, 1, 4, 3, False),
    ]
    assert _rows(lines[3]) == [
        ("req-c", "cached", True, 2, 0, 3, False),
        ("req-a", "cached", False, 1, 2, 5, False),
        ("req-b", "cached", False, 1, 3, 4, False),
    ]


def test_steps_go_on_after_msprobe_step_filter_ends(tmp_path):
    """msprobe stops for good after its last listed step; the log keeps one distinct step per forward."""
    config = write_config(tmp_path, step=[0, 1])
    env = env_for("0.5.2", DUMP_ON="1", MSPROBE_GENERATE_CONFIG=str(config), MSPROBE_HOOKS_GENERATE_FORWARDS="all")
    server_args = {"disable_cuda_graph": True, "disable_overlap_schedule": True}
    result = run_scenario("0.5.2", env, server_args=server_args, max_new_tokens=4)
    assert result.returncode == 0, result.stderr
    pid = result.json()["pid"]
    lines = dispatch_log(tmp_path / "dump", pid)
    assert [line["step"] for line in lines] == list(range(5))
    assert [line["dumped"] for line in lines] == [True, True, False, False, False]
    assert sorted(step_folders(tmp_path / "dump", pid)) == [0, 1]


def test_dispatch_log_only_without_a_generate_config(tmp_path):
    """No MSPROBE_GENERATE_CONFIG: no dump, CUDA graphs allowed, the log goes to the output dir's generate/."""
    env = env_for("0.5.2", DUMP_ON="1", MSPROBE_HOOKS_OUTPUT_DIR=str(tmp_path / "out"))
    result = run_scenario("0.5.2", env, server_args={"disable_overlap_schedule": True}, max_new_tokens=2)
    assert result.returncode == 0, result.stderr
    pid = result.json()["pid"]
    root = tmp_path / "out" / "generate"
    lines = dispatch_log(root, pid)
    assert [line["step"] for line in lines] == [0, 1, 2]
    assert not any(line["dumped"] for line in lines)
    assert step_folders(root, pid) == {}
    assert "[msprobe]" not in result.stderr and "debugger.start()" not in result.stderr


def test_native_dump_stays_in_charge_with_dp_attention(tmp_path):
    """0.5.11 with DP attention: SGLang's own debugger dumps into rank{gpu_id}; we add none and move it under {pid}.

    0.5.21 without DP runs for real in test_real_sglang.py; the debugger's identity is checked here.
    """
    version = "0.5.11"
    native = write_config(tmp_path, name="native.json")
    server_args = {
        "msprobe_dump_config": str(native),
        "enable_dp_attention": True,
        "dp_size": 2,
        "disable_piecewise_cuda_graph": True,
    }
    code = f"""
        import json, os
        from sglang.srt.server_args import ServerArgs
        from sglang_harness import Scheduler
        from msprobe.pytorch import PrecisionDebugger
        from msprobe_hooks import debugger
        scheduler = Scheduler(ServerArgs(**{server_args!r}), gpu_id=1)
        scheduler.generate({WAVES!r}, 2)
        print(json.dumps({{"pid": os.getpid(), "ours": debugger._created_for is not None,
                           "same": PrecisionDebugger._instance is scheduler.model_runner.msprobe_debugger}}))
    """
    result = run_python(code, env_for(version, DUMP_ON="1", MSPROBE_HOOKS_GENERATE_FORWARDS="prefill"))
    assert result.returncode == 0, result.stderr
    answer = result.json()
    assert not answer["ours"] and answer["same"]
    root = tmp_path / "dump"
    lines = dispatch_log(root, answer["pid"])
    assert [(line["step"], line["phase"], line["dumped"], line["rank"]) for line in lines] == [
        (0, "prefill", True, 1),
        (1, "prefill", True, 1),
        (2, "decode", True, 1),  # the native switch dumps decodes too
    ]
    assert step_folders(root, answer["pid"]) == {0: ["rank1"], 1: ["rank1"], 2: ["rank1"]}
    assert not any(p.name.startswith("step") for p in root.iterdir())  # nothing left at the shared top level
    assert [r["request_id"] for r in lines[2]["requests"]] == ["req-a", "req-b", "req-c"]


def test_generate_config_on_native_versions_only_places_the_log(tmp_path):
    """0.5.11+ without --msprobe-dump-config: a warning naming the flag, no dump, the log under dump_path."""
    config = write_config(tmp_path)
    result = run_scenario(
        "0.5.23", env_for("0.5.23", DUMP_ON="1", MSPROBE_GENERATE_CONFIG=str(config)), max_new_tokens=1
    )
    assert result.returncode == 0, result.stderr
    assert "--msprobe-dump-config" in result.stderr and "engine_kwargs.sglang.msprobe_dump_config" in result.stderr
    lines = dispatch_log(tmp_path / "dump", result.json()["pid"])
    assert len(lines) == 2 and not any(line["dumped"] for line in lines)


_REFUSALS = """
    import json
    from sglang.srt.server_args import ServerArgs
    from sglang_harness import Scheduler
    outcome = []
    for server_args in {cases!r}:
        try:
            Scheduler(ServerArgs(**server_args))
            outcome.append("started")
        except Exception as exc:
            outcome.append(type(exc).__name__ + ": " + str(exc))
    print(json.dumps(outcome))
"""


@pytest.mark.parametrize(
    ("version", "cases", "expected"),
    [
        (
            "0.5.2",
            [{}, {"disable_cuda_graph": True}],
            ["disable_cuda_graph=False", "--disable-cuda-graph", None],
        ),
        (
            "0.5.10",
            [{"disable_cuda_graph": True}, {"disable_cuda_graph": True, "disable_piecewise_cuda_graph": True}],
            ["disable_piecewise_cuda_graph=False", "--disable-piecewise-cuda-graph", None],
        ),
        (
            "0.5.11",
            [
                {"msprobe_dump_config": "NATIVE"},
                {"msprobe_dump_config": "NATIVE", "disable_piecewise_cuda_graph": True},
            ],
            ["disable_piecewise_cuda_graph=False", "drop --msprobe-dump-config", None],
        ),
        ("0.5.23", [{"msprobe_dump_config": "NATIVE"}], [None]),
    ],
)
def test_dump_with_cuda_graphs_is_refused(tmp_path, version, cases, expected):
    """A dump CUDA graphs would leave empty stops the runner before it loads, naming the flag that fixes it."""
    native = str(write_config(tmp_path, name="native.json"))
    cases = [{k: native if v == "NATIVE" else v for k, v in case.items()} for case in cases]
    env = env_for(version, DUMP_ON="1", MSPROBE_GENERATE_CONFIG=str(write_config(tmp_path)))
    result = run_python(_REFUSALS.format(cases=cases), env)
    assert result.returncode == 0, result.stderr
    outcome = result.json()
    assert outcome[0].startswith("GraphModeRefused: ") if expected[0] else outcome[0] == "started"
    if expected[0]:
        assert expected[0] in outcome[0] and expected[1] in outcome[0]
        assert outcome[1:] == ["started"]
        assert expected[1] in result.stderr  # also logged, for logs that drop the traceback


def test_no_refusal_when_only_logging(tmp_path):
    """Without a dump asked for, CUDA graphs are fine: the dispatch log works in every mode."""
    result = run_python(
        _REFUSALS.format(cases=[{}]), env_for("0.5.10", DUMP_ON="1", MSPROBE_HOOKS_OUTPUT_DIR=str(tmp_path))
    )
    assert result.json() == ["started"]


def test_spawned_scheduler_process_is_patched_through_the_environment(tmp_path):
    """As SGLang's engine does: the scheduler runs in a spawned child, which activates from the inherited env."""
    config = write_config(tmp_path)
    code = f"""
        import json, os
        from sglang.srt.server_args import ServerArgs
        from sglang_harness import run_engine
        answer = run_engine(ServerArgs(disable_cuda_graph=True), {WAVES!r}, 2)
        print(json.dumps({{"parent": os.getpid(), **answer}}))
    """
    result = run_python(code, env_for("0.5.2", DUMP_ON="1", MSPROBE_GENERATE_CONFIG=str(config)))
    assert result.returncode == 0, result.stderr
    answer = result.json()
    assert answer["pid"] != answer["parent"] and answer["active"]
    root = tmp_path / "dump"
    assert sorted(p.name for p in root.iterdir()) == [str(answer["pid"])]
    lines = dispatch_log(root, answer["pid"])
    assert [line["dumped"] for line in lines] == [True, True, False]
    assert "applied patch sglang.model_runner" in result.stderr


def test_failing_forward_keeps_its_exception_and_stops_msprobe(tmp_path):
    """The host's exception comes through unchanged; msprobe is not left recording; the forward is still logged."""
    config = write_config(tmp_path)
    code = """
        import json, os, torch
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
        from sglang_harness import Scheduler
        from msprobe_hooks import debugger
        runner = Scheduler(ServerArgs(disable_cuda_graph=True, disable_overlap_schedule=True)).model_runner
        batch = ForwardBatch(forward_mode=ForwardMode.DUMMY_FIRST, batch_size=0,
                             input_ids=torch.zeros(0, dtype=torch.int64), seq_lens=torch.zeros(0),
                             seq_lens_cpu=torch.zeros(0), extend_seq_lens_cpu=[], extend_prefix_lens_cpu=[])
        try:
            runner.forward(batch)
        except ValueError as exc:
            error = str(exc)
        print(json.dumps({"pid": os.getpid(), "error": error, "recording": debugger.is_recording()}))
    """
    env = env_for("0.5.2", DUMP_ON="1", MSPROBE_GENERATE_CONFIG=str(config), MSPROBE_HOOKS_GENERATE_FORWARDS="all")
    result = run_python(code, env)
    assert result.returncode == 0, result.stderr
    answer = result.json()
    assert answer["error"].startswith("Invalid forward mode") and not answer["recording"]
    (line,) = dispatch_log(tmp_path / "dump", answer["pid"])
    assert (line["forward_mode"], line["requests"], line["step"]) == ("DUMMY_FIRST", [], 0)


def test_a_debugger_made_by_someone_else_is_not_taken_over(tmp_path):
    """Another msprobe debugger already in the process: one clear error, no dump, the log and the host go on."""
    config = write_config(tmp_path)
    other = write_config(tmp_path, name="other.json", dump_path=str(tmp_path / "other"))
    code = f"""
        import json, os
        from msprobe.pytorch import PrecisionDebugger
        PrecisionDebugger(config_path={str(other)!r})
        from sglang.srt.server_args import ServerArgs
        from sglang_harness import Scheduler
        outputs = Scheduler(ServerArgs(disable_cuda_graph=True)).generate({WAVES[:1]!r}, 1)
        print(json.dumps({{"pid": os.getpid(), "outputs": outputs}}))
    """
    result = run_python(code, env_for("0.5.2", DUMP_ON="1", MSPROBE_GENERATE_CONFIG=str(config)))
    assert result.returncode == 0, result.stderr
    assert "SGLang forwards are not dumped: this process already has an msprobe debugger" in result.stderr
    lines = dispatch_log(tmp_path / "dump", result.json()["pid"])
    assert len(lines) == 1 and not lines[0]["dumped"]
    assert not (tmp_path / "other").exists()


def test_patches_revert_and_never_double_wrap(tmp_path):
    code = """
        import json
        from sglang.srt.model_executor import forward_batch_info, model_runner
        from sglang.srt.managers import schedule_batch
        from msprobe_hooks import bootstrap
        targets = [
            (model_runner.ModelRunner, "forward"),
            (model_runner.ModelRunner, "__init__"),
            (forward_batch_info.ForwardBatch, "init_new"),
            (schedule_batch.ScheduleBatch, "get_model_worker_batch"),
        ]
        wrapped = [type(vars(owner)[name]).__name__ for owner, name in targets]
        originals = [vars(owner)[name].__wrapped__ for owner, name in targets]
        from msprobe_hooks import patching
        from msprobe_hooks.patches.sglang import SGLANG_MODEL_RUNNER
        patching.apply(SGLANG_MODEL_RUNNER, model_runner)  # a second application
        still_once = vars(model_runner.ModelRunner)["forward"].__wrapped__ is originals[0]
        bootstrap.deactivate()
        restored = [vars(owner)[name] is original for (owner, name), original in zip(targets, originals)]
        print(json.dumps({"wrapped": wrapped, "once": still_once, "restored": restored}))
    """
    result = run_python(code, env_for("0.5.2", DUMP_ON="1", MSPROBE_HOOKS_OUTPUT_DIR=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    answer = result.json()
    assert answer["wrapped"] == ["FunctionWrapper"] * 4
    assert answer["once"] and answer["restored"] == [True] * 4


def test_schedule_batch_patch_has_nothing_to_wrap_from_0_5_6(tmp_path):
    code = """
        import json
        from sglang.srt.managers import schedule_batch
        from msprobe_hooks import patching
        state = {s.name: s.state for s in patching.status()}
        method = vars(schedule_batch.ScheduleBatch).get("get_model_worker_batch")
        print(json.dumps({"state": state["sglang.schedule_batch"], "wrapped": type(method).__name__}))
    """
    result = run_python(code, env_for("0.5.10", DUMP_ON="1", MSPROBE_HOOKS_OUTPUT_DIR=str(tmp_path)))
    assert result.json() == {"state": "applied", "wrapped": "function"}
