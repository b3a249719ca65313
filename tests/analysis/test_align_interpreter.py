"""``msprobe-hooks align`` in a fresh interpreter: what the command loads (tests/analysis/test_align.py: its rules)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
from support.golden import GOLDEN
from support.interpreter import clean_env

from msprobe_hooks.inference.dispatch_log import ScheduledRequest, step_line

pytestmark = pytest.mark.interpreter  # starts a fresh interpreter (make test-fast leaves it out)


def test_align_imports_no_torch(tmp_path):
    training = GOLDEN / "align" / "actor"
    (log,) = training.glob("*/update_actor_log.jsonl")
    (sample,) = json.loads(log.read_text().splitlines()[0])["samples"]  # one prefill of the first prompt
    n, base = sample["prompt_len"], sample["request_id"]
    prefill = ScheduledRequest(f"{base}-1a2b3c4d", base, True, n, 0, n, sample["prompt_hash"])
    generate = tmp_path / "generate"
    (generate / "1").mkdir(parents=True)
    line = step_line(engine="vllm", engine_version="0.32.0", rank=0, step=0, dumped=True, requests=[prefill])
    (generate / "1" / "dispatch_log.jsonl").write_text(line + "\n")
    shutil.copytree(GOLDEN / "align" / "embedding" / f"tokens{n}", generate / "1" / "step0" / "rank0")
    code = f"""
        import sys
        from msprobe_hooks import cli
        status = cli.main(["align", {str(training)!r}, {str(generate)!r}, "-o", {str(tmp_path / "p.jsonl")!r}])
        assert status == 0, status
        assert "torch" not in sys.modules, "align imported torch"
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=clean_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
