"""``make demo`` (``examples/demo.sh``) as the Makefile runs it: verl's own ``python3 -m verl.trainer.main_ppo``, end
to end on CPU with the hooks on from the environment, then a decode-only fault in the CPU kit's RL loop.

Two ``main_ppo`` runs of two global steps, launched by :mod:`cpu_kit.main_ppo` in ``.venv-verl-e2e``
(``make install-verl-e2e``): Ray, the agent loop, vLLM CPU as an async rollout server, the FSDP2 actor, the weight sync
after every step. The hooks come from the environment only: the shim first on PYTHONPATH, ``DUMP_ON=1 PROMPTS_ONLY=1``,
the msprobe configs of both sides; verl's own preflight passes on the recipe's overrides the launcher starts with.
Each run is then aligned and compared by the script, as a user does.

* ``healthy``: the v1 trainer (TransferQueue), fp32 on both sides, whole sequences dumped too (``DUMP_SEQUENCES=1``,
  tensor mode). ``align`` pairs every sample with its prefill and every response token after the first with its
  decode step, ``compare`` finds no divergence at any step and names no cause.
* ``bf16``: the legacy trainer (``RayPPOTrainer.fit``) with a real cause set through verl's configuration, the one
  a user meets: ``model_dtype=fp32`` with FSDP's mixed precision left at verl's default, a bf16 forward, against
  vLLM in fp32. ``compare`` names the whole model's precision. This job joins a Ray cluster started apart
  (``ray start --head``) in an environment without the hooks' variables: they reach its workers only through
  ``msprobe-hooks ray-env``'s runtime_env.

In both, the gap log agrees with verl's own ``training/rollout_probs_diff_*`` of the same steps. A run takes ~3-5
min on 2 cores; the launcher kills the whole process group at its timeout (a failed weight sync hangs rather than
exits).

* ``decode_fault``: what ``main_ppo`` cannot show, one global step of ``cpu_kit/rl_loop.py`` with the CPU kit's vLLM
  plugin scaling ``demo_inputs.PERTURBED_MODULE``'s output in decode-only steps (``CPU_KIT_DECODE_FAULT``; tensor
  mode, ``DUMP_SEQUENCES=1`` so each response token's rows can be cut). Its ground truth is transformers' forward of
  the same tokens with that module scaled at the positions decode steps feed: the rollout's log-probs equal it, the
  trainer's equal the clean forward; the report must name the module on the decode path.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas
import pytest
from support import REPO
from support.pages import figures_drawn, rendered
from support.rl_loop import FP32_GAP, LoopRun, largest_gap, oracle_log_probs, reference_model, run_demo
from support.verl_runs import HANG_LIMIT_S
from support.vllm_standin import read_log

from cpu_kit import demo_inputs
from cpu_kit.main_ppo import TIMEOUT_S
from cpu_kit.main_ppo import Run as MainPpoRun
from cpu_kit.rl_loop import RESPONSE_LENGTHS, token_gaps
from msprobe_hooks.analysis.results import CausePath, Verdict
from msprobe_hooks.cli.ray_env import HYDRA_PREFIX
from msprobe_hooks.config import SHIM_PACKAGE

pytestmark = pytest.mark.engine  # runs the real engines (make test-fast leaves it out)

VERL_E2E_PYTHON = REPO / ".venv-verl-e2e" / "bin" / "python"
STEPS = 2
# The gap log and verl compute |exp(old) - exp(rollout)| from the same float32 tensors: they agree to rounding.
SAME_VALUE = 1e-6


@dataclass
class Launch:
    trainer: str  # "v1" or "legacy"
    run: MainPpoRun
    printed: str  # what the demo printed

    @property
    def dumps(self) -> Path:
        return self.run.work / "dumps"

    def train_log(self) -> list[dict]:
        (path,) = (self.dumps / "actor").glob("*/update_actor_log.jsonl")
        return read_log(path)

    def prompt_dumps(self) -> list[dict]:
        """The training log's prompt-only dumps (PROMPTS_ONLY=1): one a sample, what prefill pairs read."""
        return [line for line in self.train_log() if line["dump"] == "prompt"]

    def gap_log(self) -> list[dict]:
        (path,) = (self.dumps / "actor").glob("*/logprob_gap.jsonl")
        return read_log(path)

    def dispatch_log(self) -> list[dict]:
        (path,) = (self.dumps / "generate").glob("*/dispatch_log.jsonl")
        return read_log(path)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``examples/demo.sh`` as the Makefile runs it: its output folder and what it printed."""
    assert VERL_E2E_PYTHON.exists(), f"{VERL_E2E_PYTHON} is missing: build it with `make install-verl-e2e`"
    out = tmp_path_factory.mktemp("demo") / "out"
    # Each main_ppo launcher kills its process group at TIMEOUT_S; the RL loop's act is bounded by HANG_LIMIT_S.
    return out, run_demo("demo.sh", out, 2 * (TIMEOUT_S + 120) + HANG_LIMIT_S, VERL_E2E_PYTHON.parent)


@pytest.fixture(scope="module")
def healthy(demo) -> Launch:
    """The v1 trainer, the same weights on both sides, fp32 both."""
    return Launch("v1", MainPpoRun.of(demo[0] / "main_ppo" / "healthy"), demo[1])


@pytest.fixture(scope="module")
def bf16(demo) -> Launch:
    """The legacy trainer, its FSDP mixed precision at verl's default (a bf16 forward), vLLM in fp32."""
    return Launch("legacy", MainPpoRun.of(demo[0] / "main_ppo" / "bf16"), demo[1])


@pytest.fixture(scope="module", params=["healthy", "bf16"])
def launched(request) -> Launch:
    return request.getfixturevalue(request.param)


def analysed(run: Launch) -> tuple[pandas.DataFrame, str, dict]:
    """What the demo's ``align`` + ``compare`` wrote for the run: pairs.csv, compare's cause line, the diagnosis."""
    folder = run.run.work / "report"
    diagnosis = json.loads((folder / "diagnosis.json").read_text())
    cause = next(line for line in (folder / "summary.md").read_text().splitlines() if "cause: " in line)
    return pandas.read_csv(folder / "pairs.csv", keep_default_na=False), cause, diagnosis


def test_the_demo_answers_each_run_in_one_line(demo) -> None:
    causes = [line.split(":", 2)[1] for line in demo[1].splitlines() if line.startswith("cause: ")]
    assert causes == [" none", " precision", " module (decode)"], demo[1][-3000:]


def test_the_trainer_runs_its_steps_with_the_hooks_in_every_process(launched: Launch) -> None:
    metrics = launched.run.metrics()
    assert sorted(metrics) == list(range(1, STEPS + 1)), launched.printed
    assert all(step["actor/grad_norm"] > 0 for step in metrics.values())  # the reward gives non-zero advantages
    log = launched.run.log.read_text(errors="replace")
    assert "msprobe-hooks preflight: verl config: no findings" in log  # the recipe's overrides satisfy it
    # Both sides dumped every global step: the actor's log-prob pass (one prompt-only dump per sample) ...
    lines = launched.train_log()
    assert len(launched.prompt_dumps()) == STEPS
    assert all((launched.dumps / "actor" / f"step{line['step']}" / "rank0" / "dump.json").is_file() for line in lines)
    # ... and vLLM's worker, each model step of both rollouts, every request one of the trainer's.
    dispatch = launched.dispatch_log()
    requests = {row["request_id_base"] for line in dispatch for row in line["requests"]}
    assert {ids for line in lines for ids in line["request_ids"]} <= requests
    assert len(requests) == STEPS


def test_the_bf16_job_joined_a_cluster_started_apart_and_the_hooks_reached_it_by_ray_env(bf16: Launch) -> None:
    cluster = json.loads((bf16.run.work / "cluster.json").read_text())
    # The cluster's own environment could not activate a worker: no variable of ours, no shim on its PYTHONPATH ...
    assert cluster["hooks_variables"] == []
    assert SHIM_PACKAGE not in cluster["PYTHONPATH"] and cluster["PYTHONPATH"]
    # ... the job joined it by address and carried ray-env's overrides (verl merges them into its runtime_env) ...
    command = json.loads((bf16.run.work / "command.json").read_text())
    assert f"+ray_kwargs.ray_init.address={cluster['address']}" in command
    assert any(word.startswith(f'{HYDRA_PREFIX}PYTHONPATH="') and SHIM_PACKAGE in word for word in command)
    assert f'{HYDRA_PREFIX}DUMP_ON="1"' in command
    log = bf16.run.log.read_text(errors="replace")
    assert "Connecting to existing Ray cluster at address" in log
    # ... so the workers' dumps of every step (the test above: the actor's and vLLM's) came through them.


def test_the_training_log_names_verls_global_step(launched: Launch) -> None:
    # The legacy trainer stamps no step on the log-prob pass's batch (its per-sample global_steps is the rollout's
    # weights' version, the step before): the trim patch puts verl's on it for the call.
    assert [line["global_step"] for line in launched.prompt_dumps()] == sorted(launched.run.metrics())
    assert {line["global_step"] for line in launched.train_log()} == set(launched.run.metrics())


def test_align_pairs_every_prefill_and_decode_step_and_compare_finds_no_divergence_on_the_healthy_run(
    healthy: Launch,
) -> None:
    pairs, cause, diagnosis = analysed(healthy)
    prefill, decode = pairs[pairs["kind"] == "prefill"], pairs[pairs["kind"] == "decode"]
    assert sorted(prefill["global_step"]) == [line["global_step"] for line in healthy.prompt_dumps()]
    # Every response token after the first comes from a decode step of vLLM's: each one paired, in every step.
    sequences = [line for line in healthy.train_log() if line["dump"] == "sequence"]
    expected = {line["global_step"]: sum(s["response_len"] - 1 for s in line["samples"]) for line in sequences}
    assert decode.groupby("global_step").size().to_dict() == expected and sum(expected.values()) > STEPS
    assert set(pairs["verdict"]) == {Verdict.NO_DIVERGENCE.value}, cause
    summary = (healthy.run.work / "report" / "summary.md").read_text()
    assert f"run: no global step diverges ({STEPS} steps compared)" in summary
    assert diagnosis["cause"] == "none", cause
    # vLLM runs beside verl here, and msprobe then leaves its logits processor out: the hooks keep each dumped step's
    # logits themselves, and every response token (a prefill's first, each decode step's) is read against them
    tokens = len(prefill) + len(decode)
    evidence = "\n".join(diagnosis["evidence"])
    assert "the rollout's log-probs equal log_softmax(logits) to " in evidence, evidence
    assert f"on all {tokens} response tokens checked" in evidence, evidence
    assert "training's recomputed log-probs equal log_softmax(logits) " in evidence, evidence


def test_a_bf16_forward_under_model_dtype_fp32_is_named_the_models_precision(bf16: Launch) -> None:
    pairs, cause, diagnosis = analysed(bf16)
    assert len(pairs) == STEPS and set(pairs["kind"]) == {"prefill"}  # every sample paired with its prefill
    assert (diagnosis["cause"], diagnosis["path"], diagnosis["module"]) == ("precision", None, None), cause
    whole_model = "model dtype bfloat16 (training) vs float32 (rollout) on 100% of the compared rows"
    assert diagnosis["evidence"][0] == whole_model
    assert min(gap["max"] for gap in bf16.gap_log()) > 100 * FP32_GAP  # the symptom the cause is given for


def test_the_gap_log_is_verls_own_rollout_probs_diff(launched: Launch) -> None:
    metrics, gaps = launched.run.metrics(), launched.gap_log()
    assert len(gaps) == len(metrics) == STEPS  # one sample a step (the recipe), in step order
    for gap, step in zip(gaps, sorted(metrics), strict=True):
        ours = metrics[step]
        assert math.isclose(gap["probs_diff_max"], ours["training/rollout_probs_diff_max"], abs_tol=SAME_VALUE)
        assert math.isclose(gap["probs_diff_mean"], ours["training/rollout_probs_diff_mean"], abs_tol=SAME_VALUE)


def test_the_healthy_runs_gap_is_fp32_noise(healthy: Launch) -> None:
    # fp32 on both sides, the weights synced every step, the tokenizer filling the vocabulary (docs/verl-main-ppo.md)
    assert max(gap["max"] for gap in healthy.gap_log()) < FP32_GAP


# --- act 3: the decode-only fault in the CPU kit's RL loop -------------------------------------------------------

DECODE_FAULT = (f"model.{demo_inputs.PERTURBED_MODULE}", demo_inputs.PERTURBATION)  # the plugin's MODULE:FACTOR
STEPS_PER_ROLLOUT = sum(RESPONSE_LENGTHS)  # one request at a time: a prefill, then a decode per further token


@pytest.fixture(scope="module")
def decode_fault(demo) -> LoopRun:
    return LoopRun.of(demo[0] / "decode_fault")


def test_the_decode_fault_changes_decode_steps_only(demo, decode_fault: LoopRun) -> None:
    reference = reference_model(demo[0] / "inputs" / "model")
    (step,) = decode_fault.steps
    assert [len(s["response_token_ids"]) for s in step["samples"]] == list(RESPONSE_LENGTHS)
    for sample in step["samples"]:
        # The oracle: the trainer's log-probs are transformers' of the checkpoint; the rollout's, transformers' with
        # the module scaled at the positions decode steps feed: the first response token (from the prefill) clean,
        # every later one (from a decode step) moved, far beyond fp32 noise.
        assert largest_gap(oracle_log_probs(reference, sample), sample["training_log_probs"]) < FP32_GAP
        faulted = oracle_log_probs(reference, sample, decode_fault=DECODE_FAULT)
        assert largest_gap(faulted, sample["rollout_log_probs"]) < FP32_GAP
        first, *later = token_gaps(sample)
        assert first < FP32_GAP and min(later) > FP32_GAP, token_gaps(sample)
    dispatch = decode_fault.dispatch_log()
    assert len(dispatch) == STEPS_PER_ROLLOUT and all(line["num_requests"] == 1 for line in dispatch)


def test_the_report_traces_the_decode_faults_gap_to_the_decode_path(demo) -> None:
    report = demo[0] / "decode_fault" / "report"
    found = pandas.read_csv(report / "pairs.csv", keep_default_na=False)
    prefill, decode = found[found["kind"] == "prefill"], found[found["kind"] == "decode"]
    module = demo_inputs.PERTURBED_MODULE
    assert len(prefill) == len(demo_inputs.PROMPT_LENS)
    assert set(prefill["verdict"]) == {Verdict.NO_DIVERGENCE.value}  # the prompts' forwards agree
    # Every response token after the first comes from a decode step, each one paired and each named.
    assert len(decode) == STEPS_PER_ROLLOUT - len(demo_inputs.PROMPT_LENS)
    assert set(decode["verdict"]) == {Verdict.DIVERGES.value}
    assert set(decode["first_module"] + " " + decode["first_io"]) == {f"{module} output"}
    samples = pandas.read_csv(report / "samples.csv")
    assert len(samples) == len(demo_inputs.PROMPT_LENS)
    assert set(samples["path"]) == {CausePath.DECODE.value}
    assert (samples["gap_max"] > FP32_GAP).all()  # the symptom the cause is given for
    diagnosis = json.loads((report / "diagnosis.json").read_text())
    assert (diagnosis["cause"], diagnosis["path"], diagnosis["module"]) == ("module", "decode", module)
    assert figures_drawn(rendered(report / "index.html")) == 2  # the depth plot and the decode heatmap


def test_the_engines_chatter_is_in_the_log_files_not_on_the_terminal(demo) -> None:
    out, printed = demo
    assert "Dump switch is turned on" not in printed
    assert "Dump switch is turned on" in (out / "logs" / "decode_fault.log").read_text()
