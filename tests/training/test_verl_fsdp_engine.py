"""Training-side dumps on verl 0.9.1's real FSDP2 engine (CPU, gloo, tiny random Qwen2, fp32).

Every configuration runs the same operations in a child process with the shim active:
actor log-prob, ref log-prob, critic values, actor update, actor log-prob again (4 samples,
micro-batches of 2). Outputs are compared with a run without DUMP_ON; dumps and log lines are
read from disk. The dumped runs are fresh interpreters, the shim patching verl as it is imported, as in a
user's job (the other engine tests fork theirs from a process that has imported verl: ``support.zygote``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from support import REPO
from support.interpreter import run_python, shim_env
from support.verl_runs import (
    OPS,
    SAMPLES,
    SPEC,
    EngineRun,
    assert_same_outputs,
    expected_sample,
    run_engine,
    sample_fields,
    seq_len,
    write_config,
)

from cpu_kit import verl_cpu
from msprobe_hooks import join_keys

pytestmark = pytest.mark.engine  # runs a real engine (make test-fast leaves it out)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return verl_cpu.build_model_dir(str(tmp_path_factory.mktemp("model")))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, model_dir: str):
    """Child runs by name, each made once for the whole module when first asked for."""
    cache: dict[str, EngineRun] = {}
    root = tmp_path_factory.mktemp("runs")
    configs = {
        "baseline": ({}, False),
        "log_prob": ({"DUMP_PHASE": "log_prob"}, True),
        "all": ({"DUMP_PHASE": "all"}, True),
        "prompts": ({"DUMP_PHASE": "all", "PROMPTS_ONLY": "1"}, True),
    }

    def get(name: str) -> EngineRun:
        if name not in cache:
            tmp = root / name
            if name == "update_l1":
                tmp.mkdir()
                # L1: no module backward hooks, so the update stays bit-identical; step [1]: msprobe
                # records only the second dumped micro-batch and then ends for good.
                config = write_config(tmp / "l1.json", level="L1", step=[1])
                env, dump = {"DUMP_PHASE": "update_actor", "MSPROBE_ACTOR_CONFIG": config}, True
            else:
                env, dump = configs[name]
            spec = {**SPEC, "model_dir": model_dir, "capture_logits": name == "prompts"}
            run = run_engine(tmp, spec, dump=dump, fresh=dump, **env)
            assert run.returncode == 0, run.stderr[-3000:]
            cache[name] = run
        return cache[name]

    return get


def _result(run: EngineRun, index: int) -> dict:
    return run.results()[index]


def test_log_prob_phase_dumps_each_actor_micro_batch_and_changes_nothing(runs) -> None:
    run, baseline = runs("log_prob"), runs("baseline")
    lines = run.log_lines()
    # Two actor log-prob passes of two micro-batches; the ref, the critic and the update: nothing.
    assert [(line["phase"], line["micro_batch"], line["dump"]) for line in lines] == [
        ("log_prob", 0, "micro_batch"),
        ("log_prob", 1, "micro_batch"),
    ] * 2
    assert [line["step"] for line in lines] == run.steps() == [0, 1, 2, 3]
    first = lines[0]
    assert first["source"] == "update_actor" and first["rank"] == 0 and first["global_step"] == 1
    assert sample_fields(first) == [expected_sample(0), expected_sample(1, offset=seq_len(0))]
    assert first["request_ids"] == [SAMPLES[0].request_id, SAMPLES[1].request_id] and first["num_requests"] == 2
    assert sample_fields(lines[1]) == [expected_sample(2), expected_sample(3, offset=seq_len(2))]
    # Each dump holds its micro-batch: both samples packed into one sequence.
    packed = len(SAMPLES[0].prompt + SAMPLES[0].response + SAMPLES[1].prompt + SAMPLES[1].response)
    embedding = run.dump(0)["Module.model.embed_tokens.FSDPEmbedding.forward.0"]
    assert embedding["input_args"][0]["shape"] == [1, packed]
    assert not any("backward" in name for name in run.dump(0))
    # Log-prob dumps only: every output of every engine, the update included, is bit-identical.
    assert_same_outputs(run, baseline, range(len(OPS)))
    # No rollout log-probs in these batches: no gap log, and no line about it.
    assert not list(run.dump_root.glob(f"*/{join_keys.GAP_LOG}"))
    assert "log-prob gap" not in run.stderr


def test_update_phase_dump_holds_its_backward_and_the_log_follows_msprobe_step_filter(runs) -> None:
    run, baseline = runs("update_l1"), runs("baseline")
    # msprobe's step filter [1] keeps only the second update micro-batch; no line for the others,
    # and none after msprobe ended (the next log-prob pass is not due anyway).
    lines = run.log_lines()
    assert [(line["step"], line["phase"], line["micro_batch"]) for line in lines] == [(1, "update_actor", 1)]
    assert run.steps() == [1]
    assert sample_fields(lines[0]) == [expected_sample(2), expected_sample(3, offset=seq_len(2))]
    names = list(run.dump(1))
    assert any(name.endswith(".backward") for name in names), "the update dump lacks its backward"
    assert names.index(next(n for n in names if n.endswith(".backward"))) > 0
    # L1 adds no module backward hooks: the update, and everything after it, is bit-identical.
    assert_same_outputs(run, baseline, range(len(OPS)))


def test_all_phases_with_the_default_mix_config(runs) -> None:
    run, baseline = runs("all"), runs("baseline")
    lines = run.log_lines()
    assert [(line["step"], line["phase"], line["micro_batch"]) for line in lines] == [
        (0, "log_prob", 0),
        (1, "log_prob", 1),
        (2, "update_actor", 0),
        (3, "update_actor", 1),
        (4, "log_prob", 0),
        (5, "log_prob", 1),
    ]
    assert run.steps() == [0, 1, 2, 3, 4, 5]
    for step in (2, 3):
        backward = [name for name in run.dump(step) if ".backward" in name]
        assert "Module.model.embed_tokens.FSDPEmbedding.backward.0" in backward
    assert not any(".backward" in name for name in run.dump(4))
    # Before the first dumped backward everything is bit-identical ...
    assert_same_outputs(run, baseline, range(3))
    # ... after it, msprobe's mix-level module backward hooks shift the update by ~1e-6 relative
    # (msprobe's own effect, also without this library), so compare with a tolerance.
    for i in (3, 4):
        got, want = _result(run, i), _result(baseline, i)
        for key in ("loss", "grad_norm"):
            if key in want:
                assert got[key] == pytest.approx(want[key], rel=1e-4)
        for got_row, want_row in zip(got.get("log_probs", []), want.get("log_probs", []), strict=True):
            assert got_row == pytest.approx(want_row, rel=1e-4, abs=1e-6)


def test_prompts_only_dumps_each_prompt_alone_and_changes_no_output(runs) -> None:
    run, reference = runs("prompts"), runs("all")
    lines = run.log_lines()
    log_prob = [line for line in lines if line["phase"] == "log_prob"]
    update = [line for line in lines if line["phase"] == "update_actor"]
    assert [line["step"] for line in lines] == run.steps() == list(range(10))
    # One dump per sample in each log-prob pass, in micro-batch order; the update as without PROMPTS_ONLY.
    assert [(line["micro_batch"], line["dump"]) for line in log_prob] == [(0, "prompt")] * 2 + [(1, "prompt")] * 2 + [
        (0, "prompt")
    ] * 2 + [(1, "prompt")] * 2
    assert [line["dump"] for line in update] == ["micro_batch", "micro_batch"]
    for n, line in enumerate(log_prob):
        index = n % 4
        assert sample_fields(line) == [expected_sample(index)]
        assert line["request_ids"] == [SAMPLES[index].request_id] and line["num_requests"] == 1
        prompt_len = len(SAMPLES[index].prompt)
        dump = run.dump(line["step"])
        # The first module's input is the prompt alone, and so is every decoder layer's.
        assert dump["Module.model.embed_tokens.FSDPEmbedding.forward.0"]["input_args"][0]["shape"] == [1, prompt_len]
        hidden = [
            arg["shape"]
            for name, entry in dump.items()
            if name.startswith("Module.model.layers.")
            for arg in entry.get("input_args", [])
            if len(arg.get("shape") or []) == 3
        ]
        assert hidden and all(shape[:2] == [1, prompt_len] for shape in hidden)
    # Prompt-only logits equal the prefix of the full forward's logits (fp32).
    logits = run.reports[0]["logits"]
    forwards = run.results()[0]["forward_tokens"]
    assert forwards == [5, 7, 8 + 11, 4, 6, 7 + 10]  # two prompts, then their micro-batch, twice
    full_rows = {0: logits[2][:8], 1: logits[2][8:], 2: logits[5][:7], 3: logits[5][7:]}
    prompt_rows = {0: logits[0], 1: logits[1], 2: logits[3], 3: logits[4]}
    for i in range(4):
        diff = max(
            abs(a - b)
            for prompt_row, full_row in zip(prompt_rows[i], full_rows[i], strict=False)
            for a, b in zip(prompt_row, full_row, strict=True)
        )
        assert len(prompt_rows[i]) == len(SAMPLES[i].prompt) and diff <= 1e-5 and math.isfinite(diff)
    # Loss and log-probs are identical to PROMPTS_ONLY=0 with the same dumps of the update.
    assert_same_outputs(run, reference, range(len(OPS)))


# verl's own CPU tests drive FSDPEngine.forward_backward_batch with a stand-in self: passed through
# the class (wrapt then binds no instance), or an engine made without __init__ (no engine_config,
# or one without forward_only). The wrapper must decide, say so once, and run the call unchanged.
STAND_IN_SELF = """
import json, sys
from contextlib import nullcontext
from types import SimpleNamespace

sys.path.insert(0, {repo!r})  # cpu_kit
from cpu_kit import verl_cpu
from msprobe_hooks import join_keys

verl_cpu.register_cpu_platform()
import torch
from tensordict import TensorDict
from verl.workers.engine.fsdp import transformer_impl
from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

from msprobe_hooks import patching

# What forward_backward_batch reaches besides self, made trivial (one micro-batch, no process group).
transformer_impl.prepare_micro_batches = lambda data, **kwargs: ([data], None)
transformer_impl.postprocess_batch_func = lambda output_lst, **kwargs: output_lst[0]
transformer_impl.get_device_id = lambda: "cpu"
torch.distributed.all_reduce = lambda *args, **kwargs: None


def stand_in(engine):
    loss = torch.tensor(3.0, requires_grad=True)
    engine.__dict__.update(
        ulysses_sequence_parallel_size=1,
        scaler=None,
        get_data_parallel_group=lambda: None,
        get_data_parallel_size=lambda: 1,
        _gradient_sync_context=lambda **kwargs: nullcontext(),
        forward_step=lambda micro_batch, loss_function, forward_only: (loss, {{"loss": loss.item()}}),
    )
    return engine, loss


def batch():
    return TensorDict({{"loss_mask": torch.ones(2)}}, batch_size=[2])


results = {{}}
engine, loss = stand_in(SimpleNamespace())
out = FSDPEngine.forward_backward_batch(engine, batch(), loss_function=None, forward_only=False)
results["through_the_class"] = [out, loss.grad.item()]
engine, loss = stand_in(object.__new__(FSDPEngine))
out = engine.forward_backward_batch(batch(), loss_function=None)
results["no_engine_config"] = [out, loss.grad.item()]
engine, loss = stand_in(object.__new__(FSDPEngine))
engine.engine_config = SimpleNamespace()
out = engine.forward_backward_batch(batch(), None, False)
results["no_forward_only"] = [out, loss.grad.item()]
results["patch"] = [s.state for s in patching.status() if s.name == "verl.fsdp_engine"]
print(json.dumps(results))
"""


def test_forward_backward_batch_with_a_stand_in_self_runs_unchanged(tmp_path: Path) -> None:
    code = STAND_IN_SELF.format(repo=str(REPO))
    variables = {"MSPROBE_HOOKS_OUTPUT_DIR": str(tmp_path / "dumps"), "DUMP_PHASE": "all"}
    dumped = run_python(code, shim_env(DUMP_ON="1", **variables), cwd=tmp_path)
    plain = run_python(code, shim_env(**variables), cwd=tmp_path)
    assert dumped.returncode == 0, dumped.stderr[-3000:]
    assert plain.returncode == 0, plain.stderr[-3000:]
    results, expected = dumped.json(), plain.json()
    assert results.pop("patch") == ["applied"] and expected.pop("patch") == []
    assert results == expected
    reports = [line for line in dumped.stderr.splitlines() if "the host goes on unaffected" in line]
    assert len(reports) == 1 and "deciding whether the pass is dumped failed" in reports[0], dumped.stderr[-3000:]
    # MSPROBE_HOOKS_STRICT=1: the same fault is raised, after its line.
    strict = run_python(code, shim_env(DUMP_ON="1", MSPROBE_HOOKS_STRICT="1", **variables), cwd=tmp_path)
    assert strict.returncode == 1 and "AttributeError" in strict.stderr.splitlines()[-1], strict.stderr[-3000:]
