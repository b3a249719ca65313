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


def test_demo_tells_the_three_stories(tmp_path: Path) -> None:
    train_bin, vllm_bin = Path(sys.executable).parent, REPO / ".venv-vllm" / "bin"
    command = ["bash", str(REPO / "examples" / "demo.sh"), str(train_bin), str(vllm_bin), str(tmp_path / "out")]
    done = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=4 * HANG_LIMIT_S)
    printed = done.stdout
    assert done.returncode == 0, printed[-3000:] + done.stderr[-3000:]
    out, prompts = tmp_path / "out", len(PROMPT_LENS)
    # 1. One checkpoint's prefill: nothing on the same weights, the planted module on the perturbed copy.
    assert printed.count(f"align: {prompts} pairs (request_id: {prompts})") == 2
    assert f"{prompts} pairs: no divergence above threshold" in printed, printed[-3000:]
    verdict = f"{prompts} pairs: first divergence: {PERTURBED_MODULE} output"
    assert verdict in printed, printed[-3000:]
    assert list(pandas.read_csv(out / "prefill/model/report/pairs.csv")["first_module"].isna()) == [True] * prompts
    pairs = pandas.read_csv(out / "prefill/perturbed/report/pairs.csv")
    assert list(pairs["first_module"]) == [PERTURBED_MODULE] * prompts
    assert (pairs["unmatched"] == 0).all()
    assert verdict.split(": ", 1)[1] in (out / "prefill/perturbed/report/index.html").read_text()
    # 2. The sync fault: since global step 2, at the tensor left out of the hand-over.
    assert (
        f"run: global step 2 is the first to diverge, at {PERTURBED_MODULE} output ({prompts} of {prompts}" in printed
    )
    assert list((out / "sync_fault" / "tensorboard").iterdir()), "no TensorBoard event file"
    # 3. The decode-only fault: the gap's cause on the decode path.
    samples = pandas.read_csv(out / "decode_fault/report/samples.csv")
    assert set(samples["prefill"]) == {"no divergence"} and set(samples["path"]) == {"decode path"}
    assert set(samples["first_decode_divergence"]) == {f"{PERTURBED_MODULE} output"}
    # the engines' chatter is in the log files, not on the terminal
    assert "Dump switch is turned on" not in printed
    assert "Dump switch is turned on" in (out / "logs" / "vllm-model.log").read_text()
