"""The CPU kit's real RL loop: one running vLLM engine, verl's FSDP2 engine, real updates handed over, dumps every step.

One loop of ``cpu_kit/rl_loop.py`` on the demo's model and prompts (``cpu_kit.demo_inputs``), with the hooks on from
the environment: three global steps, layer 1's ``down_proj`` left out of the hand-over from step 3 on (a planted sync
fault). Steps 1 and 2 are the healthy loop: fp32 noise between the sides, the running engine computing with the
weights handed to it. Step 3's ground truth is transformers' forward of the same tokens on the weights the engine
holds (step 3's hand-over with step 2's ``down_proj``): the rollout's log-probs equal it, the trainer's are far from
it. ``align`` and ``compare`` must then say the same from the dumps alone: steps 1 and 2 clean, the dropped tensor's
module from step 3 on. (``make demo``'s decode-only fault is checked with the demo, ``test_demo.py``.) One more engine
is driven directly (:class:`cpu_kit.vllm_engine.VllmEngine`): packed generation, weights handed over and back, an
error answer. Each run starts a vLLM engine (~20-40 s on 2 cores).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas
import pytest
from faults import fault_matrix as fm
from safetensors.torch import load_file
from support.interpreter import run_python
from support.pages import figures_drawn, rendered
from support.real_vllm import VLLM_PYTHON, engine_env
from support.rl_loop import (
    FP32_GAP,
    LoopRun,
    demo_inputs_in,
    kill_loop,
    largest_gap,
    log_lines,
    oracle_log_probs,
    reference_model,
    run_loop,
)
from support.vllm_standin import dumped_steps

from cpu_kit import demo_inputs
from cpu_kit.engine_server import EngineError
from cpu_kit.rl_loop import RESPONSE_LENGTHS, token_gaps
from cpu_kit.vllm_engine import VllmEngine
from msprobe_hooks.analysis.results import Verdict
from msprobe_hooks.cli import main
from msprobe_hooks.join_keys import DISPATCH_LOG, TRAINING_LOG

pytestmark = pytest.mark.engine  # runs a real engine (make test-fast leaves it out)

DROPPED = f"model.{demo_inputs.PERTURBED_MODULE}.weight"  # vLLM's and HF's name of the tensor left out
FAULT_STEP = 3  # the first global step whose hand-over leaves it out
STEPS_PER_ROLLOUT = sum(RESPONSE_LENGTHS)  # one at a time: a prefill, then a decode per further token


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_inputs_in(tmp_path_factory.mktemp("inputs"))


SYNC_FAULT = ("--iterations", str(FAULT_STEP), "--drop-tensor", DROPPED, "--at-step", str(FAULT_STEP))


@pytest.fixture(scope="module")
def sync_fault(tmp_path_factory, inputs) -> LoopRun:
    return run_loop(tmp_path_factory.mktemp("sync-fault"), inputs, *SYNC_FAULT)


def test_the_loop_keeps_the_token_gap_at_fp32_noise_until_a_tensor_is_left_out(sync_fault):
    assert [step["global_step"] for step in sync_fault.steps] == [1, 2, 3]
    for step in sync_fault.steps:
        assert [len(s["response_token_ids"]) for s in step["samples"]] == list(RESPONSE_LENGTHS)
    for step in sync_fault.steps[: FAULT_STEP - 1]:
        gaps = [gap for sample in step["samples"] for gap in token_gaps(sample)]
        assert max(gaps) < FP32_GAP, step["global_step"]
    assert [step["handover"] and step["handover"]["dropped"] for step in sync_fault.steps] == [None, [], [DROPPED]]


def test_the_running_engine_takes_the_handed_over_weights(sync_fault):
    one, two, _ = sync_fault.steps
    assert sync_fault.summary["engine"]["version"] == "0.32.0"
    for before, after in zip(one["samples"], two["samples"], strict=True):
        assert before["prompt_token_ids"] == after["prompt_token_ids"]
        # The first response token's log-prob depends on the prompt and the weights only: the
        # update moved it far beyond noise (measured 0.16-0.35), and the engine's value is the
        # trainer's (the gap test): it computes with the updated weights, not the checkpoint.
        assert abs(after["rollout_log_probs"][0] - before["rollout_log_probs"][0]) > 100 * FP32_GAP
    assert Path(two["handover"]["path"], "model.safetensors").is_file()


def test_training_and_dispatch_logs_follow_the_global_steps(sync_fault):
    count, steps = len(demo_inputs.PROMPT_LENS), len(sync_fault.steps)
    lines = sync_fault.train_log()
    # One prompt-only dump per sample of each log-prob pass, msprobe's steps counting on across global steps.
    assert [line["step"] for line in lines] == list(range(steps * count))
    assert [line["global_step"] for line in lines] == [g for g in range(1, steps + 1) for _ in range(count)]
    ids = [[f"g{g}-req-{i}"] for g in range(1, steps + 1) for i in range(count)]
    assert [line["request_ids"] for line in lines] == ids
    assert all((sync_fault.train_root / f"step{line['step']}" / "rank0" / "dump.json").is_file() for line in lines)
    # The worker's msprobe steps go on after each update too: one line and one new folder per model step.
    dispatch = sync_fault.dispatch_log()
    assert [line["step"] for line in dispatch] == list(range(steps * STEPS_PER_ROLLOUT))
    assert dumped_steps(sync_fault.generate_root, sync_fault.worker_pid()) == [f"step{n}" for n in range(len(dispatch))]
    for g in range(1, steps + 1):
        rollout = dispatch[(g - 1) * STEPS_PER_ROLLOUT : g * STEPS_PER_ROLLOUT]
        assert {row["request_id_base"] for line in rollout for row in line["requests"]} == {
            f"g{g}-req-{i}" for i in range(count)
        }
        assert all(line["num_requests"] == 1 for line in rollout)  # one request at a time
    assert sync_fault.summary["dumps"] == {
        "train_log": str(next(sync_fault.train_root.glob("*/update_actor_log.jsonl"))),
        "generate_root": str(sync_fault.generate_root),
    }


def test_a_tensor_left_out_of_the_hand_over_leaves_the_engine_on_the_stale_weight(sync_fault, inputs):
    before, faulted = sync_fault.steps[FAULT_STEP - 2], sync_fault.steps[FAULT_STEP - 1]
    # The oracle: the weights the engine holds at the fault's step are its hand-over, less the tensor it left out,
    # which keeps the step before's value; transformers' forward on them gives the rollout's log-probs.
    held = load_file(str(Path(faulted["handover"]["path"], "model.safetensors")))
    assert DROPPED not in held
    held[DROPPED] = load_file(str(Path(before["handover"]["path"], "model.safetensors")))[DROPPED]
    engine = reference_model(inputs / "model")
    assert not engine.load_state_dict(held, strict=False).unexpected_keys
    for sample in faulted["samples"]:
        stale = oracle_log_probs(engine, sample)
        assert largest_gap(stale, sample["rollout_log_probs"]) < FP32_GAP
        # The trainer computed with the updated tensor: far from the stale weights' (measured 2.9e-3 to 7.6e-3).
        assert largest_gap(stale, sample["training_log_probs"]) > 100 * FP32_GAP


def analysed(run: LoopRun, out: Path, capsys) -> tuple[pandas.DataFrame, str, Path]:
    """``align`` + ``compare`` on a loop's dumps, as a user runs them: pairs.csv, what compare printed, the report."""
    pairs_file, report = out / "pairs.jsonl", out / "report"
    assert main(["align", str(run.train_root), str(run.generate_root), "-o", str(pairs_file)]) == 0
    status = main(["compare", str(pairs_file), "-o", str(report), "--tensorboard", str(out / "tb")])
    printed = capsys.readouterr().out
    assert status == 0, printed
    return pandas.read_csv(report / "pairs.csv", keep_default_na=False), printed, report


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


def test_the_report_names_the_tensor_left_out_from_its_step_on(sync_fault, tmp_path, capsys):
    count = len(demo_inputs.PROMPT_LENS)
    found, printed, report = analysed(sync_fault, tmp_path, capsys)
    by_step = {g: found[found["global_step"] == g] for g in (1, 2, 3)}
    assert all(len(pairs) == count for pairs in by_step.values())  # every prefill paired within its own global step
    assert set(by_step[1]["verdict"]) == set(by_step[2]["verdict"]) == {Verdict.NO_DIVERGENCE.value}
    assert set(by_step[3]["verdict"]) == {Verdict.DIVERGES.value}
    # The stale weight moves its module's output by 3e-4..4e-3: the step rule names it, the fixed 2e-2 cannot.
    module = demo_inputs.PERTURBED_MODULE
    assert set(by_step[3]["first_module"] + " " + by_step[3]["first_io"]) == {f"{module} output"}
    assert set(by_step[3]["first_rule"]) == {"step"}
    assert f"run: global step 3 is the first to diverge, at {module} output ({count} of {count}" in printed
    assert "2 steps before it clean" in printed
    assert list((tmp_path / "tb").iterdir()), "no TensorBoard event file"
    assert figures_drawn(rendered(report / "index.html")) == 2  # the depth plot and the run's heatmap, by the browser


# --- the whole job killed ----------------------------------------------------------------------------------------

# Points spread over the run, each a state of the dump tree: the trainer and the vLLM engine SIGKILLed together.
KILL_POINTS: dict[str, Callable[[Path], bool]] = {
    "in global step 1's rollout": lambda dumps: log_lines(dumps / "generate", DISPATCH_LOG) >= 5,
    "in global step 2's rollout": lambda dumps: log_lines(dumps / "generate", DISPATCH_LOG) >= STEPS_PER_ROLLOUT + 3,
    "in global step 2's log-prob pass": lambda dumps: log_lines(dumps / "actor", TRAINING_LOG) >= 6,
}


@pytest.fixture(scope="module")
def undamaged(sync_fault, tmp_path_factory) -> dict[tuple[int, str], str]:
    """The whole run's verdict of each pair, by (global step, request id)."""
    out = tmp_path_factory.mktemp("undamaged")
    assert main(["align", str(sync_fault.train_root), str(sync_fault.generate_root), "-o", str(out / "p.jsonl")]) == 0
    assert main(["compare", str(out / "p.jsonl"), "-o", str(out / "report")]) == 0
    return verdicts(out / "report")


def verdicts(report: Path) -> dict[tuple[int, str], str]:
    """A report's verdict of each pair, by (global step, request id)."""
    found = pandas.read_csv(report / "pairs.csv", keep_default_na=False)
    columns = found["global_step"], found["key"], found["verdict"]
    return {(int(g), key): verdict for g, key, verdict in zip(*columns, strict=True)}


def _complete_training_dumps(actor: Path) -> set[tuple[int, str]]:
    """(global step, request id) of each training dump whose log line and ``dump.json`` are both whole."""
    complete = set()
    for log in actor.glob(f"*/{TRAINING_LOG}"):
        for raw in log.read_bytes().splitlines():
            try:
                line = json.loads(raw)
                json.loads((actor / f"step{line['step']}" / f"rank{line['rank']}" / "dump.json").read_bytes())
            except (ValueError, OSError):
                continue
            complete.add((line["global_step"], line["request_ids"][0]))
    return complete


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_whole_job_killed_leaves_every_complete_part_paired_and_judged_as_before(
    point, tmp_path, inputs, undamaged, capsys, hook_warnings
):
    with fm.cell("whole job SIGKILLed (trainer and vLLM)", fm.ALIGN, fm.COMPARE) as tally:
        dumps = kill_loop(tmp_path / "run", inputs, KILL_POINTS[point], *SYNC_FAULT)
        tally.runs += 1
        fm.check_logs(dumps, tally, killed=True)  # every line whole but, at most, the one each writer was writing
        _analysed_after_the_kill(dumps, tmp_path, undamaged, capsys, hook_warnings)


def _analysed_after_the_kill(dumps: Path, tmp_path: Path, undamaged, capsys, hook_warnings) -> None:
    complete = _complete_training_dumps(dumps / "actor")  # a global step's rollout ends before its log-prob pass
    pairs, report = tmp_path / "pairs.jsonl", tmp_path / "report"
    status = main(["align", str(dumps / "actor"), str(dumps / "generate"), "-o", str(pairs)])
    printed = capsys.readouterr()
    assert "Traceback" not in printed.out + printed.err
    if not (dumps / "actor").is_dir():  # killed before the trainer's first dump: the missing folder is named
        assert status == 2 and f"'{dumps / 'actor'}' is not a directory" in printed.err, printed.err
        return
    assert status == (0 if complete else 1), printed.out + printed.err
    # What the kill cut is named: a log's last line left without its newline, a listed dump.json not whole.
    warned = "\n".join(hook_warnings())
    for log in [*dumps.glob(f"*/*/{TRAINING_LOG}"), *dumps.glob(f"*/*/{DISPATCH_LOG}")]:
        text = log.read_bytes()
        if text and not text.endswith(b"\n"):
            assert f"{log}:{len(text.splitlines())}: not JSON (truncated?)" in warned, warned
    if not complete:
        return
    assert main(["compare", str(pairs), "-o", str(report)]) == 0
    printed = capsys.readouterr()
    assert "Traceback" not in printed.out + printed.err
    judged = verdicts(report)
    assert set(judged) == complete  # every complete part paired, nothing else
    assert judged == {key: undamaged[key] for key in judged}  # and judged as the whole run judged it
