"""The CPU kit's real RL loop: one running vLLM engine, verl's FSDP2 engine, real updates handed over, dumps every step.

Three loops of ``cpu_kit/rl_loop.py`` on the demo's model and prompts, each with the hooks on from
the environment: healthy (two global steps); with a planted sync fault (layer 1's ``down_proj``
left out of the hand-over from step 2); with the decode-only fault of the kit's vLLM plugin
(``CPU_KIT_DECODE_FAULT``, one step; tensor mode, and ``DUMP_SEQUENCES=1`` on the training side
so each response token's rows can be cut). The two faulty loops are acts 2 and 3 of ``make demo``
(``examples/demo.sh``, run here as the Makefile runs it and checked for its three stories). Same
weights and prompts make the engines bit-reproducible across runs here, so each faulty run is
checked against the healthy one dump by dump; then ``align`` and ``compare`` must say the same from
the dumps alone: nothing on the healthy loop, the dropped tensor from global step 2 on, the decode
path for the decode fault. One more engine is driven directly (:class:`cpu_kit.vllm_engine.VllmEngine`):
packed generation, weights handed over and back, an error answer. Each run starts a vLLM engine
(~20-70 s on 2 cores).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas
import pytest
from support.interpreter import run_python
from support.pages import figures_drawn, rendered
from support.real_vllm import VLLM_PYTHON, engine_env
from support.rl_loop import FP32_GAP, LoopRun, run_demo, run_loop
from support.vllm_standin import dumped_steps

from cpu_kit import demo_inputs
from cpu_kit.rl_loop import RESPONSE_LENGTHS, token_gaps
from cpu_kit.vllm_engine import EngineError, VllmEngine
from msprobe_hooks.analysis.results import CausePath, Verdict
from msprobe_hooks.cli import main

pytestmark = pytest.mark.engine  # runs a real engine (make test-fast leaves it out)

FAULT_MODULE = f"model.{demo_inputs.PERTURBED_MODULE}"  # vLLM's and HF's path of the module both faults hit
DROPPED = f"{FAULT_MODULE}.weight"
DECODE_FACTOR = demo_inputs.PERTURBATION  # the demo plants the decode fault with the prefill act's factor
STEPS_PER_ROLLOUT = sum(RESPONSE_LENGTHS)  # one at a time: a prefill, then a decode per further token


@dataclass
class Demo:
    out: Path  # demo.sh's output folder
    printed: str  # what it printed on the terminal


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """``make demo``'s loop (``examples/demo.sh``) as the Makefile runs it. Its acts 2 and 3 are this file's
    sync-fault and decode-fault loops (the same ``rl_loop.py`` options and msprobe configs), its inputs the
    healthy loop's: one engine run each, shared."""
    out = tmp_path_factory.mktemp("demo") / "out"
    return Demo(out, run_demo("demo.sh", out, hang_limits=4))


@pytest.fixture(scope="module")
def inputs(demo: Demo) -> Path:
    """The demo's model, its perturbed copy and prompts (``cpu_kit.demo_inputs``)."""
    return demo.out / "inputs"


@pytest.fixture(scope="module")
def healthy(tmp_path_factory, inputs) -> LoopRun:
    return run_loop(tmp_path_factory.mktemp("healthy"), inputs, "--iterations", "2")


@pytest.fixture(scope="module")
def sync_fault(demo: Demo) -> LoopRun:
    """Act 2: ``--iterations 2 --drop-tensor DROPPED --at-step 2``, statistics (examples/msprobe_l0.json)."""
    return LoopRun.of(demo.out / "sync_fault")


@pytest.fixture(scope="module")
def decode_fault(demo: Demo) -> LoopRun:
    """Act 3: ``CPU_KIT_DECODE_FAULT=FAULT_MODULE:DECODE_FACTOR DUMP_SEQUENCES=1``, one step, tensor mode
    (examples/msprobe_l0_tensor.json)."""
    return LoopRun.of(demo.out / "decode_fault")


def test_demo_tells_the_three_stories(demo: Demo) -> None:
    printed, out, prompts = demo.printed, demo.out, len(demo_inputs.PROMPT_LENS)
    module = demo_inputs.PERTURBED_MODULE
    assert f"{FAULT_MODULE} x {DECODE_FACTOR}" in printed  # the faults of this file's checks
    # 1. One checkpoint's prefill: nothing on the same weights, the planted module on the perturbed copy.
    assert printed.count(f"align: {prompts} pairs (request_id: {prompts})") == 2
    assert f"{prompts} pairs: no divergence above threshold" in printed, printed[-3000:]
    verdict = f"{prompts} pairs: first divergence: {module} output"
    assert verdict in printed, printed[-3000:]
    assert list(pandas.read_csv(out / "prefill/model/report/pairs.csv")["first_module"].isna()) == [True] * prompts
    pairs = pandas.read_csv(out / "prefill/perturbed/report/pairs.csv")
    assert list(pairs["first_module"]) == [module] * prompts
    assert (pairs["unmatched"] == 0).all()
    assert verdict.split(": ", 1)[1] in (out / "prefill/perturbed/report/index.html").read_text()
    # 2. The sync fault: since global step 2, at the tensor left out of the hand-over.
    assert f"run: global step 2 is the first to diverge, at {module} output ({prompts} of {prompts}" in printed
    assert list((out / "sync_fault" / "tensorboard").iterdir()), "no TensorBoard event file"
    # 3. The decode-only fault: the gap's cause on the decode path.
    samples = pandas.read_csv(out / "decode_fault/report/samples.csv")
    assert set(samples["prefill"]) == {"no divergence"} and set(samples["path"]) == {"decode path"}
    assert set(samples["first_decode_divergence"]) == {f"{module} output"}
    # the engines' chatter is in the log files, not on the terminal
    assert "Dump switch is turned on" not in printed
    assert "Dump switch is turned on" in (out / "logs" / "vllm-model.log").read_text()


def _statistics(entry: object) -> object:
    """A dump entry without its tensor files' names: statistics mode and tensor mode then compare."""
    if isinstance(entry, dict):
        return {k: _statistics(v) for k, v in entry.items() if k != "data_name"}
    if isinstance(entry, list):
        return [_statistics(v) for v in entry]
    return entry


def first_difference(ours: dict, theirs: dict) -> str | None:
    """The first dump entry, in execution order, whose statistics differ between two dumps of one step."""
    assert list(ours) == list(theirs)
    return next((name for name in ours if _statistics(ours[name]) != _statistics(theirs[name])), None)


def analysed(run: LoopRun, out: Path, capsys) -> tuple[pandas.DataFrame, str, Path]:
    """``align`` + ``compare`` on a loop's dumps, as a user runs them: pairs.csv, what compare printed, the report."""
    pairs_file, report = out / "pairs.jsonl", out / "report"
    assert main(["align", str(run.train_root), str(run.generate_root), "-o", str(pairs_file)]) == 0
    status = main(["compare", str(pairs_file), "-o", str(report), "--tensorboard", str(out / "tb")])
    printed = capsys.readouterr().out
    assert status == 0, printed
    return pandas.read_csv(report / "pairs.csv", keep_default_na=False), printed, report


def rows(line: dict) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "request_id"} for row in line["requests"]]


def prefill_step(lines: list[dict], request_id: str) -> int:
    (step,) = [
        line["step"]
        for line in lines
        for row in line["requests"]
        if row["request_id_base"] == request_id and row["full_prefill"]
    ]
    return step


def test_healthy_loop_keeps_the_token_gap_at_fp32_noise_every_step(healthy):
    assert [step["global_step"] for step in healthy.steps] == [1, 2]
    for step in healthy.steps:
        assert [len(s["response_token_ids"]) for s in step["samples"]] == list(RESPONSE_LENGTHS)
        gaps = [gap for sample in step["samples"] for gap in token_gaps(sample)]
        assert max(gaps) < FP32_GAP, step["global_step"]
    assert healthy.steps[1]["handover"]["dropped"] == []


def test_the_running_engine_takes_the_handed_over_weights(healthy):
    one, two = healthy.steps
    assert healthy.summary["engine"]["vllm"] == "0.32.0"
    for before, after in zip(one["samples"], two["samples"], strict=True):
        assert before["prompt_token_ids"] == after["prompt_token_ids"]
        # The first response token's log-prob depends on the prompt and the weights only: the
        # update moved it far beyond noise (measured 0.16-0.35), and the engine's value is the
        # trainer's (the gap test): it computes with the updated weights, not the checkpoint.
        assert abs(after["rollout_log_probs"][0] - before["rollout_log_probs"][0]) > 100 * FP32_GAP
    assert Path(two["handover"]["path"], "model.safetensors").is_file()


def test_training_and_dispatch_logs_follow_the_global_steps(healthy):
    count = len(demo_inputs.PROMPT_LENS)
    lines = healthy.train_log()
    # One prompt-only dump per sample of each log-prob pass, msprobe's steps counting on across global steps.
    assert [line["step"] for line in lines] == list(range(2 * count))
    assert [line["global_step"] for line in lines] == [1] * count + [2] * count
    assert [line["request_ids"] for line in lines] == [[f"g{g}-req-{i}"] for g in (1, 2) for i in range(count)]
    assert all((healthy.train_root / f"step{line['step']}" / "rank0" / "dump.json").is_file() for line in lines)
    # The worker's msprobe steps go on after each update too: one line and one new folder per model step.
    dispatch = healthy.dispatch_log()
    assert [line["step"] for line in dispatch] == list(range(2 * STEPS_PER_ROLLOUT))
    assert dumped_steps(healthy.generate_root, healthy.worker_pid()) == [f"step{n}" for n in range(len(dispatch))]
    for g, rollout in ((1, dispatch[:STEPS_PER_ROLLOUT]), (2, dispatch[STEPS_PER_ROLLOUT:])):
        assert {row["request_id_base"] for line in rollout for row in line["requests"]} == {
            f"g{g}-req-{i}" for i in range(count)
        }
        assert all(line["num_requests"] == 1 for line in rollout)  # one request at a time
    assert healthy.summary["dumps"] == {
        "train_log": str(next(healthy.train_root.glob("*/update_actor_log.jsonl"))),
        "generate_root": str(healthy.generate_root),
    }


def test_a_tensor_left_out_of_the_hand_over_shows_from_that_step_on(healthy, sync_fault):
    (one, healthy_one), (two, _) = zip(sync_fault.steps, healthy.steps, strict=True)
    assert two["handover"]["dropped"] == [DROPPED]
    # Step 1 ran before any hand-over: the very same numbers as the healthy run.
    for side in ("rollout_log_probs", "training_log_probs"):
        assert [s[side] for s in one["samples"]] == [s[side] for s in healthy_one["samples"]]
    # Step 2: the rollout ran the stale down_proj (measured: each sample's largest gap 2.9e-3 to 7.6e-3).
    gaps = [max(token_gaps(sample)) for sample in two["samples"]]
    assert min(gaps) > 100 * FP32_GAP, gaps
    # The trainer is the same in both runs through step 2's log-prob pass: its dumps are equal ...
    for line in sync_fault.train_log():
        assert sync_fault.train_dump(line["step"]) == healthy.train_dump(line["step"]), line["step"]
    # ... while each step-2 prefill in vLLM first differs at the module whose weight was not handed over.
    ours, theirs = sync_fault.dispatch_log(), healthy.dispatch_log()
    for i in range(len(demo_inputs.PROMPT_LENS)):
        for g in (1, 2):
            step = prefill_step(ours, f"g{g}-req-{i}")
            assert step == prefill_step(theirs, f"g{g}-req-{i}")
            first = first_difference(sync_fault.generate_dump(step), healthy.generate_dump(step))
            if g == 1:
                assert first is None
            else:
                assert first is not None and first.startswith(f"Module.{FAULT_MODULE}."), first


def test_the_decode_fault_changes_decode_steps_only(healthy, decode_fault):
    ours = decode_fault.dispatch_log()
    theirs = healthy.dispatch_log()[: len(ours)]
    # The same schedule and rows (vLLM's random request-id suffix aside).
    assert [rows(line) for line in ours] == [rows(line) for line in theirs]
    decode_steps = 0
    for line in ours:
        first = first_difference(decode_fault.generate_dump(line["step"]), healthy.generate_dump(line["step"]))
        if any(row["prefill"] for row in line["requests"]):
            assert first is None, line["step"]  # prefill numerics untouched
        else:
            decode_steps += 1
            assert first is not None and first.startswith(f"Module.{FAULT_MODULE}."), (line["step"], first)
    assert decode_steps == STEPS_PER_ROLLOUT - len(demo_inputs.PROMPT_LENS)
    # The symptom: the first response token comes from the prefill (no gap), every later one from a
    # decode step (measured gaps 1.8e-4 to 3.2e-3).
    for sample, clean in zip(decode_fault.steps[0]["samples"], healthy.steps[0]["samples"], strict=True):
        assert sample["rollout_log_probs"][0] == clean["rollout_log_probs"][0]
        first, *later = token_gaps(sample)
        assert first < FP32_GAP and min(later) > FP32_GAP, token_gaps(sample)


def test_the_decode_fault_plugin_is_inert_without_its_variable(tmp_path):
    code = """
        import json, os
        from vllm import ModelRegistry
        import cpu_kit_decode_fault as plugin

        def qwen2():
            return ModelRegistry.models[plugin.ARCHITECTURE].module_name

        seen = {"before": qwen2()}
        plugin.register()
        seen["unset"] = qwen2()
        os.environ[plugin.VARIABLE] = "down_proj"
        try:
            plugin.register()
        except ValueError as exc:
            seen["bad"] = str(exc)
        os.environ[plugin.VARIABLE] = "model.layers.1.mlp.down_proj:1.05"
        plugin.register()
        seen["set"] = qwen2()
        print(json.dumps(seen))
    """
    done = run_python(code, engine_env(tmp_path), python=str(VLLM_PYTHON), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = done.json()
    assert seen["before"] == seen["unset"] == "vllm.model_executor.models.qwen2"
    assert (
        seen["bad"]
        == "CPU_KIT_DECODE_FAULT='down_proj': expected MODULE:FACTOR, e.g. model.layers.1.mlp.down_proj:1.05"
    )
    assert seen["set"] == "cpu_kit_decode_fault.model"


def test_the_engine_server_packs_reloads_and_survives_an_error(tmp_path, inputs):
    prompts = demo_inputs.read_prompts(inputs / "prompts.jsonl")

    def requests(tag: str) -> list[dict]:
        return [
            {"id": f"{tag}-{i}", "prompt_token_ids": p["prompt_token_ids"], "max_tokens": RESPONSE_LENGTHS[i]}
            for i, p in enumerate(prompts)
        ]

    rpc_dir = tempfile.mkdtemp(prefix="vllm-rpc")
    try:
        engine = VllmEngine(VLLM_PYTHON, inputs / "model", env=engine_env(rpc_dir), log_path=tmp_path / "engine.log")
        with engine:
            alone = engine.request("generate", requests=requests("alone"))
            packed = engine.request("generate", requests=requests("packed"), packed=True)
            engine.update_weights(inputs / "perturbed")
            perturbed = engine.generate(requests("perturbed"))
            engine.update_weights(inputs / "model")
            restored = engine.generate(requests("restored"))
            with pytest.raises(EngineError) as refused:
                engine.update_weights(tmp_path / "no-such-folder")
            after_error = engine.generate(requests("after"))
        assert engine.process.returncode == 0
    finally:
        shutil.rmtree(rpc_dir, ignore_errors=True)
    outputs = alone["outputs"]
    assert [o["id"] for o in outputs] == [r["id"] for r in requests("alone")]
    assert [len(o["token_ids"]) for o in outputs] == list(RESPONSE_LENGTHS)
    assert alone["steps"] == STEPS_PER_ROLLOUT
    # Packed: the same greedy tokens, in fewer engine steps (decode rows share steps).
    assert [o["token_ids"] for o in packed["outputs"]] == [o["token_ids"] for o in outputs]
    assert packed["steps"] < alone["steps"]
    for a, b in zip(packed["outputs"], outputs, strict=True):
        assert max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"], strict=True)) < FP32_GAP
    # The perturbed copy's weights are used, then the checkpoint's again, exactly.
    assert all(
        abs(p["logprobs"][0] - o["logprobs"][0]) > 100 * FP32_GAP for p, o in zip(perturbed, outputs, strict=True)
    )
    assert [(o["token_ids"], o["logprobs"]) for o in restored] == [(o["token_ids"], o["logprobs"]) for o in outputs]
    assert "no-such-folder" in str(refused.value)
    assert [(o["token_ids"], o["logprobs"]) for o in after_error] == [(o["token_ids"], o["logprobs"]) for o in outputs]


def test_the_report_names_nothing_on_the_healthy_loop_and_the_dropped_tensor_from_step_2(
    healthy, sync_fault, tmp_path, capsys
):
    count = len(demo_inputs.PROMPT_LENS)
    clean, printed, _ = analysed(healthy, tmp_path / "healthy", capsys)
    assert len(clean) == 2 * count and set(clean["verdict"]) == {Verdict.NO_DIVERGENCE.value}
    assert "run: no global step diverges (2 steps compared)" in printed
    found, printed, report = analysed(sync_fault, tmp_path / "sync_fault", capsys)
    by_step = {g: found[found["global_step"] == g] for g in (1, 2)}
    assert len(by_step[1]) == len(by_step[2]) == count  # every prefill paired within its own global step
    assert set(by_step[1]["verdict"]) == {Verdict.NO_DIVERGENCE.value}
    assert set(by_step[2]["verdict"]) == {Verdict.DIVERGES.value}
    # The stale weight moves its module's output by 3e-4..4e-3: the step rule names it, the fixed 2e-2 cannot.
    assert set(by_step[2]["first_module"] + " " + by_step[2]["first_io"]) == {f"{demo_inputs.PERTURBED_MODULE} output"}
    assert set(by_step[2]["first_rule"]) == {"step"}
    module = demo_inputs.PERTURBED_MODULE
    assert f"run: global step 2 is the first to diverge, at {module} output ({count} of {count}" in printed
    assert "1 steps before it clean" in printed
    dom = rendered(report / "index.html")
    assert figures_drawn(dom) == 2  # the depth plot and the run's heatmap, drawn by the browser


def test_the_report_traces_the_decode_faults_gap_to_the_decode_path(decode_fault, tmp_path, capsys):
    found, printed, report = analysed(decode_fault, tmp_path, capsys)
    prefill, decode = found[found["kind"] == "prefill"], found[found["kind"] == "decode"]
    assert len(prefill) == len(demo_inputs.PROMPT_LENS)
    assert set(prefill["verdict"]) == {Verdict.NO_DIVERGENCE.value}  # the prompts' forwards agree
    # Every response token after the first comes from a decode step, each one paired and each named.
    assert len(decode) == STEPS_PER_ROLLOUT - len(demo_inputs.PROMPT_LENS)
    assert set(decode["verdict"]) == {Verdict.DIVERGES.value}
    assert set(decode["first_module"] + " " + decode["first_io"]) == {f"{demo_inputs.PERTURBED_MODULE} output"}
    samples = pandas.read_csv(report / "samples.csv")
    assert len(samples) == len(demo_inputs.PROMPT_LENS)
    assert set(samples["path"]) == {CausePath.DECODE.value}
    assert (samples["gap_max"] > FP32_GAP).all()  # the symptom the cause is given for
    assert CausePath.DECODE.value in printed
    assert figures_drawn(rendered(report / "index.html")) == 2  # the depth plot and the decode heatmap
