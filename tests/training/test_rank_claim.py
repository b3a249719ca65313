"""Two processes dumping one rank under one training dump root: the later one names the earlier at its first dump."""

from __future__ import annotations

import json
import os
import socket

from msprobe_hooks.training import rank_claim


def test_the_first_writer_claims_the_rank_and_a_second_is_named_with_it(tmp_path, monkeypatch):
    assert rank_claim.claim(str(tmp_path), 0) is None
    claimed = json.loads((tmp_path / "rank0.writer").read_text())
    assert (claimed["pid"], claimed["host"]) == (os.getpid(), socket.gethostname())
    assert rank_claim.claim(str(tmp_path), 0) is None  # this process again: its own claim
    assert rank_claim.claim(str(tmp_path), 1) is None  # another rank: another folder
    monkeypatch.setattr(os, "getpid", lambda: 4242)  # a second process on the same root
    line = rank_claim.claim(str(tmp_path), 0)
    assert line is not None
    assert f"also written by pid {claimed['pid']} on {claimed['host']}" in line
    assert f"this process is pid 4242 on {socket.gethostname()}" in line
    assert str(tmp_path / "rank0.writer") in line and "MSPROBE_HOOKS_OUTPUT_DIR" in line
    assert json.loads((tmp_path / "rank0.writer").read_text())["pid"] == claimed["pid"]  # the first claim stays


def test_no_rank_an_unreadable_claim_or_an_unwritable_root_never_raise(tmp_path):
    assert rank_claim.claim(str(tmp_path), None) is None and not list(tmp_path.iterdir())
    (tmp_path / "rank0.writer").write_text("not json")
    assert "also written by pid ? on ?" in rank_claim.claim(str(tmp_path), 0)
    assert rank_claim.claim(str(tmp_path / "no-such-folder"), 0) is None
