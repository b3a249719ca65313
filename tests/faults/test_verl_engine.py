"""Faults in verl 0.9.1's real FSDP2 engine on CPU: msprobe broken, storage failing, a rank's prompt forward failing.

msprobe broken and the full disk are injected into its real Megatron engine too (the ``engine`` fixture).
Every run is ``tests/support/verl_engine_child.py`` (FSDP: actor log-prob, update, log-prob; Megatron:
``verl_runs.MEGATRON_SPEC``'s ops; 4 samples in micro-batches of 2) under the shim, with the fault site
(``fault_site/sitecustomize.py``, chained by the shim) injecting the fault. Survived means: exit 0,
every result equal to the run without DUMP_ON, exactly the lines of ours the cell names, every
log file line-complete JSON. Under ``MSPROBE_HOOKS_STRICT=1`` the same fault must stop the run,
naming the fault.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support import golden
from support.verl_runs import EngineRun, run_engine, write_config

from msprobe_hooks.cli import main

from . import fault_matrix as fm
from .verl_faults import BOTH, SPEC, Engine, assert_stopped, assert_unchanged, faulted, tmpfs

# --- msprobe broken ----------------------------------------------------------------------------

MSPROBE_FAULTS = {
    "msprobe start() raises": ("msprobe_start", "PrecisionDebugger.start failed"),
    "msprobe stop() raises": ("msprobe_stop", "PrecisionDebugger.stop failed"),
    "msprobe step() raises": ("msprobe_step", "PrecisionDebugger.step failed"),
}


@pytest.mark.parametrize("fault", MSPROBE_FAULTS)
def test_msprobe_raising_leaves_the_engine_unchanged_with_one_line(fault, tmp_path, engine: Engine):
    inject, message = MSPROBE_FAULTS[fault]
    with fm.cell(fault, *engine.targets) as tally:
        run = faulted(tmp_path / "default", engine.model_dir, inject, engine.spec, **BOTH)
        tally.runs += 1
        assert_unchanged(run, engine.baseline)
        lines = fm.our_lines(run.stderr)
        assert len(lines) == 1 and message in lines[0] and "the host goes on unaffected" in lines[0], lines
        assert f"patch {engine.patch}:" in lines[0], lines
        fm.check_logs(run.dump_root, tally)
    if not fm.has_strict(fault, engine.column):  # its STRICT variant is the FSDP engine's (fault_matrix)
        return
    with fm.cell(fault, *engine.targets, strict=True) as tally:
        run = faulted(tmp_path / "strict", engine.model_dir, inject, engine.spec, MSPROBE_HOOKS_STRICT="1", **BOTH)
        tally.runs += 1
        assert_stopped(run, f"RuntimeError: {message}")
        fm.check_logs(run.dump_root, tally)


@pytest.mark.parametrize(("target", "prompts"), [(fm.VERL_FSDP, "0"), (fm.PROMPTS_ONLY, "1")])
def test_without_msprobe_the_first_due_dump_is_refused_in_one_line(target, prompts, tmp_path, model_dir):
    with fm.cell("msprobe not importable", target, how="refused, one line") as tally:
        spec = {"ops": ["actor.log_prob"]}
        run = faulted(tmp_path, model_dir, "msprobe_missing", spec, DUMP_PHASE="all", PROMPTS_ONLY=prompts)
        tally.runs += 1
        assert run.returncode != 0 and run.reports == []
        refusals = [line for line in run.stderr.splitlines() if "DebuggerUnavailable: DUMP_ON=1 needs msprobe" in line]
        assert len(refusals) == 1 and "pip install 'mindstudio-probe" in refusals[0], run.stderr[-3000:]
        assert not run.dump_root.exists()


@pytest.mark.parametrize("strict", ["0", "1"])
def test_a_config_msprobe_rejects_names_the_file_in_one_line(strict, tmp_path, model_dir, baseline):
    fault = "msprobe rejects the config"
    config = write_config(tmp_path / "rejected.json", statistics={"summary_mode": "bogus"})
    with fm.cell(fault, fm.VERL_FSDP, fm.PROMPTS_ONLY, strict=strict == "1") as t:
        run = faulted(tmp_path, model_dir, "", MSPROBE_ACTOR_CONFIG=config, MSPROBE_HOOKS_STRICT=strict, **BOTH)
        t.runs += 1
        if strict == "1":
            assert_stopped(run, f"ConfigRejected: msprobe rejected the config {config}")
            return
        assert_unchanged(run, baseline)
        lines = fm.our_lines(run.stderr)
        assert len(lines) == 1 and f"msprobe rejected the config {config}" in lines[0], lines
        assert not run.dump_root.exists()


# --- storage -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strict", "engine"), [("0", "fsdp"), ("1", "fsdp"), ("0", "megatron")], indirect=["engine"]
)  # the Megatron engine's STRICT variant is the FSDP engine's (fault_matrix.NO_STRICT_CELLS)
def test_a_full_disk_names_the_device_and_the_lost_steps(strict, tmp_path, engine: Engine):
    # 200 kB: less than the first step's dump of either engine (msprobe L1).
    with (
        tmpfs(tmp_path / "full", "200k") as mount,
        fm.cell("disk full (tmpfs)", engine.column, strict=strict == "1") as t,
    ):
        env = {"MSPROBE_HOOKS_OUTPUT_DIR": str(mount), "MSPROBE_HOOKS_STRICT": strict, **BOTH}
        run = faulted(tmp_path, engine.model_dir, "", engine.spec, **env)
        t.runs += 1
        cause = f"no space left on the device holding {mount}"
        if strict == "1":
            assert_stopped(run, "No space left on device")
            assert len(fm.our_lines(run.stderr, cause)) == 1
            fm.check_logs(mount, t)
            return
        assert_unchanged(run, engine.baseline)
        lines = fm.our_lines(run.stderr)
        # One line when it happens (the cause, the first step lost), one at exit listing what was lost.
        assert len(lines) == 2, lines
        assert cause in lines[0] and "msprobe dump step0/rank0 could not be written" in lines[0], lines
        assert lines[1].split(": ", 1)[1].startswith("msprobe dump step0/rank0"), lines
        lost_steps = {item.split()[2] for item in lines[1].split(": ", 1)[1].split(", ") if item.startswith("msprobe")}
        complete = {p.parent.parent.name + "/rank0" for p in mount.glob("actor/step*/rank0/dump.json") if _parses(p)}
        folders = {f"{p.parent.name}/{p.name}" for p in mount.glob("actor/step*/rank0")}
        # Nothing lost silently: every step folder not named lost holds a whole dump (a step named lost may
        # hold an earlier flush of it, which parses: msprobe writes a step's files whole at every flush).
        assert lost_steps and folders - lost_steps <= complete
        fm.check_logs(mount, t)


def _parses(path: Path) -> bool:

    try:
        json.loads(path.read_text())
    except ValueError:
        return False
    return True


def test_the_dump_folder_removed_mid_run(tmp_path, model_dir, baseline):
    # msprobe makes its step folders anew; our log, removed with them, is made anew with one line.
    root = tmp_path / "dumps" / "actor"
    with fm.cell("dump folder removed mid-run", fm.VERL_FSDP) as tally:
        run = faulted(tmp_path, model_dir, "remove_root", FAULT_ROOT=str(root), **BOTH)
        tally.runs += 1
        assert_unchanged(run, baseline)
        lines = fm.our_lines(run.stderr)
        assert len(lines) == 1 and "update_actor_log.jsonl was removed while the job ran" in lines[0], lines
        # Removed after step 1's step(): its line is written anew, the folders of steps 2 on are made anew.
        assert [line["step"] for line in run.log_lines()] == list(range(1, 10))
        assert run.steps() == list(range(2, 10))
        fm.check_logs(root, tally)


@pytest.mark.parametrize("strict", ["0", "1"])
def test_the_dump_root_remounted_read_only_mid_run(strict, tmp_path, model_dir, baseline):
    with (
        tmpfs(tmp_path / "mount", "64m") as mount,
        fm.cell("dump root turns read-only mid-run", fm.VERL_FSDP, strict=strict == "1") as t,
    ):
        run = faulted(
            tmp_path,
            model_dir,
            "readonly_root",
            MSPROBE_HOOKS_OUTPUT_DIR=str(mount),
            FAULT_ROOT=str(mount),
            MSPROBE_HOOKS_STRICT=strict,
            **BOTH,
        )
        t.runs += 1
        if strict == "1":
            assert_stopped(run, "Read-only file system")
            return
        assert_unchanged(run, baseline)
        lines = fm.our_lines(run.stderr)
        assert len(lines) <= 2 and f"the file system holding {mount}" in lines[0] and "read-only" in lines[0], lines
        fm.check_logs(mount, t)


# --- processes -----------------------------------------------------------------------------------


def test_double_activation_dumps_each_step_once(tmp_path, model_dir, baseline):
    with fm.cell("double activation", fm.VERL_FSDP) as tally:
        run = faulted(tmp_path, model_dir, "double_activation", **BOTH)
        tally.runs += 1
        assert_unchanged(run, baseline)
        assert fm.our_lines(run.stderr) == []
        applied = [line for line in run.stderr.splitlines() if "applied patch verl.fsdp_engine" in line]
        assert len(applied) == 1
        lines = run.log_lines()
        assert [line["step"] for line in lines] == run.steps() and len(lines) == 4 + 2 + 4  # prompts, update, prompts
        fm.check_logs(run.dump_root, tally)


def test_two_jobs_on_one_dump_root_are_named_and_their_folders_never_paired(
    tmp_path, model_dir, baseline, capsys, hook_warnings
):
    # msprobe names step folders by rank only: the second job overwrites the first's step{N}/rank0.
    root = tmp_path / "shared"
    with fm.cell("two jobs writing one rank's step folders", fm.VERL_FSDP, fm.ALIGN) as tally:
        first, second = (
            faulted(tmp_path / job, model_dir, "", MSPROBE_HOOKS_OUTPUT_DIR=str(root), **BOTH)
            for job in ("first", "second")
        )
        tally.runs += 2
        assert_unchanged(first, baseline)
        assert_unchanged(second, baseline)
        assert fm.our_lines(first.stderr) == []
        (line,) = fm.our_lines(second.stderr)
        holder, writer = (int(re.search(rf"{what} pid (\d+)", line).group(1)) for what in ("written by", "process is"))
        assert {holder, writer} == {entry["pid"] for entry in _log_lines(root / "actor")}, line
        assert f"[msprobe-hooks {holder}]" in first.stderr and "rank 0, is also written by" in line
        fm.check_logs(root, tally)
        # align names both processes and pairs none of the folders both wrote (every one of them here): nothing.
        pairs = tmp_path / "pairs.jsonl"
        assert main(["align", str(root / "actor"), str(golden.GOLDEN / "vllm" / "generate"), "-o", str(pairs)]) == 1
        (named,) = [warning for warning in hook_warnings() if "processes" in warning]
        assert f"pid {holder} (" in named and f"pid {writer} (" in named, named
        count = len(_log_lines(root / "actor"))
        assert (
            f"nothing paired (of {count} training dumps: {count} written by two processes)" in capsys.readouterr().err
        )


def _log_lines(root: Path) -> list[dict]:
    return [
        json.loads(line) for path in root.glob("*/update_actor_log.jsonl") for line in path.read_text().splitlines()
    ]


@pytest.fixture(scope="module")
def two_rank_baseline(tmp_path_factory, model_dir) -> EngineRun:
    spec = {**SPEC, "ops": ["actor.log_prob"], "model_dir": model_dir}
    run = run_engine(tmp_path_factory.mktemp("two_rank"), spec, world_size=2, dump=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.mark.parametrize("strict", ["0", "1"])
def test_a_prompt_forward_failing_on_one_rank_keeps_the_ranks_in_step(strict, tmp_path, model_dir, two_rank_baseline):
    spec = {"ops": ["actor.log_prob"]}
    fault = "a prompt-only forward fails on one rank"
    with fm.cell(fault, fm.PROMPTS_ONLY, strict=strict == "1") as tally:
        run = faulted(
            tmp_path, model_dir, "prompt_forward", spec, world_size=2, PROMPTS_ONLY="1", MSPROBE_HOOKS_STRICT=strict
        )  # a hang fails through verl_runs.HANG_LIMIT_S
        tally.runs += 1
        if strict == "1":
            assert_stopped(run, "a prompt-only forward failed partway")
            return
        assert run.returncode == 0, run.stderr[-3000:]
        for rank in (0, 1):
            assert run.results(rank)[0]["log_probs"] == two_rank_baseline.results(rank)[0]["log_probs"]
        lines = fm.our_lines(run.stderr)
        assert len(lines) == 1 and "a prompt-only forward failed" in lines[0] and "[msprobe-hooks" in lines[0], lines
        # Rank 1 dumped its first prompt only; rank 0 all of its own.
        assert len(run.log_lines(rank=0)) == 2 and len(run.log_lines(rank=1)) == 1
        fm.check_logs(run.dump_root, tally)
