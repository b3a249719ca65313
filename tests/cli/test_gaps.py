"""``msprobe-hooks gaps``: the worst samples of the training side's gap logs, and the settings to dump them."""

from __future__ import annotations

import json
from pathlib import Path

from msprobe_hooks.cli import main
from msprobe_hooks.join_keys import GAP_LOG


def _line(step: int, request_id: str, gap: float) -> dict:
    """A line as the training side writes it (docs/training.md, the gap log)."""
    return {
        "source": "logprob_gap", "timestamp": "2026-12-01T22:49:13", "pid": 1, "rank": 0, "global_step": step,
        "micro_batch": 0, "sample": 0, "request_id": request_id, "uid": "u", "session_id": 0, "prompt_len": 4,
        "prompt_hash": "0" * 16, "tokens": 3, "max": gap, "mean": gap / 2, "argmax": 1, "over": 0,
        "threshold": 0.1, "probs_diff_max": gap / 10, "probs_diff_mean": gap / 20,
    }  # fmt: skip


def _root(tmp_path: Path) -> Path:
    lines = [
        _line(1, "a", 0.01),
        _line(1, "b", 0.3),
        _line(2, "c", 0.2),
        _line(2, "det-0", 0.5),
        _line(2, "det-0", 0.4),
    ]
    for pid, part in ((100, lines[:3]), (101, lines[3:])):  # two training processes
        (tmp_path / str(pid)).mkdir()
        text = "".join(json.dumps(line) + "\n" for line in part)
        (tmp_path / str(pid) / GAP_LOG).write_text(text + ('{"source": "logprob_gap", "glob' if pid == 101 else ""))
    return tmp_path


def test_the_worst_samples_first_with_the_settings_that_dump_them(tmp_path, capsys):
    assert main(["gaps", str(_root(tmp_path)), "--top", "3"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "5 samples in 2 gap logs; the 3 with the largest gap:"  # the line cut by a kill skipped
    rows = [line.split() for line in printed[2:5]]
    assert [(row[0], row[1], row[3]) for row in rows] == [
        ("2", "det-0", "0.5"),
        ("2", "det-0", "0.4"),
        ("1", "b", "0.3"),
    ]
    assert printed[-1] == "  export DUMP_SEQUENCES=1 DUMP_REQUEST_IDS=det-0,b"  # samples sharing an id: once


def test_one_global_step(tmp_path, capsys):
    assert main(["gaps", str(_root(tmp_path)), "--global-step", "1"]) == 0
    printed = capsys.readouterr().out
    assert "2 samples" in printed and "DUMP_REQUEST_IDS=b,a" in printed


def test_a_folder_without_gap_logs_is_named(tmp_path, capsys):
    assert main(["gaps", str(tmp_path)]) == 2
    assert f"no {GAP_LOG} under {tmp_path}" in capsys.readouterr().err
    assert main(["gaps", str(tmp_path / "missing")]) == 2
    assert main(["gaps", str(tmp_path), "--top", "0"]) == 2
