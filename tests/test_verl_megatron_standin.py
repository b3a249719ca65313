"""The Megatron engine patch, driven through a stand-in of verl's Megatron engine module.

The stand-in (``tests/standins/megatron_transformer_impl.py``) is first checked against the
patch's contract; then a fresh interpreter with the shim active imports it under the real module
name (a finder serves its file), so activation, version gate, contract check and patch run as
they would on the real module, and real msprobe dumps its small torch chunks.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from conftest import REPO, run_python, shim_env

from msprobe_hooks import contracts
from msprobe_hooks.patches import PATCHES

STANDIN = REPO / "tests" / "standins" / "megatron_transformer_impl.py"
TARGET = "verl.workers.engine.megatron.transformer_impl"
INSTALLED_VERL = "0.9.1"

CHILD = f"""
import importlib, importlib.machinery, importlib.util, json, sys, types
sys.path.insert(0, {str(REPO / "examples")!r})
import torch, verl_cpu
verl_cpu.init_process()
from msprobe_hooks import patching
from msprobe_hooks.actor_dump import DumpRefused

class StandinFinder:  # serves the stand-in file for the real module name, ahead of site-packages
    def find_spec(self, fullname, path=None, target=None):
        if fullname == {TARGET!r}:
            return importlib.util.spec_from_file_location(fullname, {str(STANDIN)!r})
        return None

sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder), StandinFinder())
standin = importlib.import_module({TARGET!r})  # through the activation's import hooks, as in a job

samples = verl_cpu.random_samples(4, 0)
trimmed = [verl_cpu.Sample(s.prompt, (), s.uid, s.session_id, s.request_id) for s in samples]

def engine(cls, forward_only=False, chunks=1):
    return cls(types.SimpleNamespace(forward_only=forward_only), [standin.make_chunk(i) for i in range(chunks)])

def loss_function(**kwargs):
    raise AssertionError("the stand-in computes its own loss")

outcomes = {{}}
def attempt(name, run, rows=samples, forward_only=False):
    try:
        with torch.no_grad() if forward_only else torch.enable_grad():
            run.forward_backward_batch(verl_cpu.make_batch(rows), None if forward_only else loss_function, forward_only)
        outcomes[name] = "ok"
    except DumpRefused as exc:
        outcomes[name] = "refused: " + str(exc)

actor = engine(standin.MegatronEngineWithLMHead)
for name, run, rows, forward_only in {{scenarios}}:
    if name == "middle_stage.update":
        standin.mpu.last_stage = False
    attempt(name, eval(run), eval(rows), forward_only)
    standin.mpu.last_stage = True
print(json.dumps({{"status": {{s.name: s.state for s in patching.status()}}, "outcomes": outcomes}}))
"""

SCENARIOS = [
    ("actor.log_prob", "actor", "samples", True),
    ("actor.update", "actor", "samples", False),
    ("ref.log_prob", "engine(standin.MegatronEngineWithLMHead, forward_only=True)", "samples", True),
    ("critic.update", "engine(standin.MegatronEngineWithValueHead)", "samples", False),
    ("middle_stage.update", "actor", "samples", False),
    ("vpp.update", "engine(standin.MegatronEngineWithLMHead, chunks=2)", "samples", False),
    ("actor.log_prob_trimmed", "actor", "trimmed", True),
]


def _patch_record():
    return next(p for p in PATCHES if p.name == "verl.megatron_engine")


def test_standin_satisfies_the_contract_of_the_installed_version() -> None:
    facts = contracts.extract_facts(ast.parse(STANDIN.read_text()))
    items = [item for item in _patch_record().contract if contracts.applies(item, INSTALLED_VERL)]
    assert any(item.module == TARGET for item in items)
    for item in items:
        if item.module == TARGET:
            assert contracts.check_facts(item, facts) is None
        else:  # the rest of verl is the real, installed one
            assert contracts.check_facts(item, contracts.installed_facts(item.module)) is None


def _run(tmp_path: Path, **env: str) -> tuple[dict, list[dict], Path]:
    code = CHILD.replace("{scenarios}", repr(SCENARIOS))
    result = run_python(code, shim_env(DUMP_ON="1", MSPROBE_HOOKS_OUTPUT_DIR=str(tmp_path), **env), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    root = tmp_path / "actor"
    lines = [
        json.loads(line) for path in root.glob("*/update_actor_log.jsonl") for line in path.read_text().splitlines()
    ]
    return result.json(), sorted(lines, key=lambda line: line["step"]), root


def test_actor_micro_batches_are_dumped_on_the_last_stage_only(tmp_path: Path) -> None:
    report, lines, root = _run(tmp_path, DUMP_PHASE="all")
    assert report["status"]["verl.megatron_engine"] == "applied"
    outcomes = report["outcomes"]
    assert {k: v for k, v in outcomes.items() if k != "vpp.update"} == {
        name: "ok" for name, *_ in SCENARIOS if name != "vpp.update"
    }
    assert outcomes["vpp.update"].startswith("refused: DUMP_ON=1 with virtual pipeline parallelism (2 model chunks")
    # actor log-prob (2 micro-batches), actor update (2), trimmed log-prob (2); nothing for the ref
    # engine, the critic, a middle pipeline stage, or the refused virtual-pipeline run.
    assert [(line["step"], line["phase"], line["micro_batch"]) for line in lines] == [
        (0, "log_prob", 0),
        (1, "log_prob", 1),
        (2, "update_actor", 0),
        (3, "update_actor", 1),
        (4, "log_prob", 0),
        (5, "log_prob", 1),
    ]
    assert [s["uid"] for s in lines[0]["samples"]] == ["uid0", "uid0"]
    assert [s["prompt_len"] for s in lines[1]["samples"]] == [4, 6]
    assert sorted(int(p.name[4:]) for p in root.glob("step*")) == [0, 1, 2, 3, 4, 5]
    for step in range(6):
        names = list(json.loads((root / f"step{step}" / "rank0" / "dump.json").read_text())["data"])
        # Every model chunk is bound: msprobe names modules by chunk index.
        assert any(name.startswith("Module.0.") for name in names)
        has_backward = any(".backward" in name for name in names)
        assert has_backward == (step in (2, 3)), f"step {step}: backward dumped={has_backward}"


def test_prompts_only_needs_a_trimmed_batch_on_megatron(tmp_path: Path) -> None:
    report, lines, _ = _run(tmp_path, DUMP_PHASE="log_prob", PROMPTS_ONLY="1")
    outcomes = report["outcomes"]
    assert outcomes["actor.log_prob"].startswith("refused: PROMPTS_ONLY=1 on the Megatron engine")
    assert "use PROMPTS_ONLY=trim" in outcomes["actor.log_prob"]
    assert outcomes["actor.log_prob_trimmed"] == "ok"
    assert [(line["step"], line["dump"]) for line in lines] == [(0, "micro_batch"), (1, "micro_batch")]
    assert [s["prompt_len"] for s in lines[0]["samples"]] == [5, 7]
