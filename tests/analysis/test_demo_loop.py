"""``make demo``'s loop, run as the Makefile runs it: both real engines, align, compare, the report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas
import pytest
from support import REPO
from support.interpreter import clean_env
from support.verl_runs import HANG_LIMIT_S

from cpu_kit.demo_inputs import PERTURBED_MODULE, PROMPT_LENS

pytestmark = pytest.mark.engine  # runs a real engine (make test-fast leaves it out)


def test_demo_names_the_planted_fault(tmp_path: Path) -> None:
    train_bin, vllm_bin = Path(sys.executable).parent, REPO / ".venv-vllm" / "bin"
    command = ["bash", str(REPO / "examples" / "demo.sh"), str(train_bin), str(vllm_bin), str(tmp_path / "out")]
    done = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=2 * HANG_LIMIT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    prompts = len(PROMPT_LENS)
    assert done.stdout.count(f"align: {prompts} pairs (request_id: {prompts})") == 2
    same, planted = tmp_path / "out" / "model" / "report", tmp_path / "out" / "perturbed" / "report"
    assert f"{prompts} pairs: no divergence above threshold" in done.stdout, done.stdout[-3000:]
    verdict = f"{prompts} pairs: first divergence: {PERTURBED_MODULE} output"
    assert verdict in done.stdout, done.stdout[-3000:]
    assert list(pandas.read_csv(same / "pairs.csv")["first_module"].isna()) == [True] * prompts
    pairs = pandas.read_csv(planted / "pairs.csv")
    assert list(pairs["first_module"]) == [PERTURBED_MODULE] * prompts
    assert (pairs["unmatched"] == 0).all()
    html = (planted / "index.html").read_text()
    assert verdict.split(": ", 1)[1] in html and "data:image/png;base64," in html
    # the engines' chatter is in the log files, not on the terminal
    assert "Dump switch is turned on" not in done.stdout
    assert "Dump switch is turned on" in (tmp_path / "out" / "logs" / "vllm-model.log").read_text()
