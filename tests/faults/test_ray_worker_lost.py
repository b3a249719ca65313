"""A Ray worker lost mid-dump, in verl's own trainer: ``python -m verl.trainer.main_ppo`` by the CPU kit's launcher, the
hooks from the environment, three global steps asked for. The FSDP actor's Ray worker (verl's ``WorkerDict``) is
SIGKILLed by the fault site as it is about to write global step 2's log-prob dump (``FAULT_INJECT=kill_in_dump``):
msprobe's ``start()`` has made the step's folder, nothing of the forward is written, and our log line never comes.

What must hold: the job fails as verl fails when a worker dies (the TaskRunner's ``ray.get`` raises Ray's
``ActorDiedError``, the driver exits 1 by itself: no hang, nothing of ours in the way); every log line of ours is whole;
``align`` names the dump the worker left unlisted, pairs global step 1 as in a whole run, and counts global step 2's
rollout as having no counterpart.
"""

from __future__ import annotations

import json
import os
import subprocess

import pandas
import pytest
from support import REPO
from support.interpreter import shim_env
from support.vllm_standin import read_log

from cpu_kit.main_ppo import TIMEOUT_S
from cpu_kit.main_ppo import Run as MainPpoRun
from faults import fault_matrix as fm
from msprobe_hooks.analysis.results import Unpaired, Verdict
from msprobe_hooks.cli import main
from msprobe_hooks.join_keys import TRAINING_LOG

pytestmark = pytest.mark.engine  # runs verl's trainer, Ray and vLLM (make test-fast leaves it out)

VERL_E2E_PYTHON = REPO / ".venv-verl-e2e" / "bin" / "python"
LOST_DUMP = "actor/step1"  # the actor's second log-prob dump: global step 2 (PROMPTS_ONLY=1, one sample a step)


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> MainPpoRun:
    assert VERL_E2E_PYTHON.exists(), f"{VERL_E2E_PYTHON} is missing: build it with `make install-verl-e2e`"
    work = tmp_path_factory.mktemp("worker_lost")
    config = os.fspath(REPO / "examples" / "msprobe_l0.json")
    env = shim_env(
        fm.FAULT_SITE,
        DUMP_ON="1",
        PROMPTS_ONLY="1",
        MSPROBE_ACTOR_CONFIG=config,
        MSPROBE_GENERATE_CONFIG=config,
        MSPROBE_HOOKS_OUTPUT_DIR=os.fspath(work / "dumps"),
        FAULT_INJECT="kill_in_dump",
        FAULT_KILL_DUMP=LOST_DUMP,
    )
    command = [os.fspath(VERL_E2E_PYTHON), "-m", "cpu_kit.main_ppo", os.fspath(work), "--steps", "3"]
    subprocess.run(command, cwd=REPO, env=env, capture_output=True, timeout=TIMEOUT_S + 120)
    return MainPpoRun.of(work)


def test_the_job_fails_as_verl_fails_when_a_worker_dies(killed: MainPpoRun) -> None:
    with fm.cell("a Ray worker lost mid-dump (verl main_ppo)", fm.VERL_FSDP) as tally:
        tally.runs += 1
        log = killed.log.read_text(errors="replace")
        assert (killed.returncode, killed.timed_out) == (1, False), log[-3000:]  # by itself, not by the timeout
        assert "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task." in log
        assert sorted(killed.metrics()) == [1]  # global step 1 trained; step 2 died with the worker
        assert not fm.our_lines(log)  # nothing of ours warned or failed on the way
        fm.check_logs(killed.work / "dumps", tally, killed=True)


def test_align_names_the_lost_workers_dump_and_pairs_the_rest(killed: MainPpoRun, tmp_path, capsys) -> None:
    with fm.cell("a Ray worker lost mid-dump (verl main_ppo)", fm.ALIGN) as tally:
        tally.runs += 1
        dumps = killed.work / "dumps"
        (log,) = (dumps / "actor").glob(f"*/{TRAINING_LOG}")
        assert [line["global_step"] for line in read_log(log)] == [1]
        lost = dumps / LOST_DUMP / "rank0" / "dump.json"
        assert json.loads(lost.read_text())["data"] == {}  # msprobe's start() wrote the folder, nothing more
        pairs = tmp_path / "pairs.jsonl"
        status = main(["align", str(dumps / "actor"), str(dumps / "generate"), "-o", str(pairs)])
        printed = capsys.readouterr()
        assert status == 0, printed.err
        assert "Traceback" not in printed.out + printed.err
        assert f"1 training dump(s) that no training log line lists: {lost}; " in printed.err
        assert "align: 1 pairs (request_id: 1) from 1 training dumps" in printed.out
        assert Unpaired.NO_COUNTERPART.value in printed.out  # global step 2's rollout: its training side was lost
        assert main(["compare", str(pairs), "-o", str(tmp_path / "report")]) == 0
        judged = pandas.read_csv(tmp_path / "report" / "pairs.csv", keep_default_na=False)
        assert list(zip(judged["global_step"], judged["verdict"], strict=True)) == [(1, Verdict.NO_DIVERGENCE.value)]
