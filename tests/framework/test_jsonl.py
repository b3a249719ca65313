"""The one reader of the JSON-lines files (the processes' logs, pairs.jsonl) and its policy for a bad line."""

from __future__ import annotations

import logging

import pytest

from msprobe_hooks import jsonl
from msprobe_hooks.analysis.pairing import pairs
from msprobe_hooks.log import NAME as LOGGER

LINES = '{"step": 0}\n\n{"step": 1, "cut\n[1, 2]\n{"step": 2}\n{"step": 3, "ki'  # blank, damaged, a list, cut


def test_bad_lines_are_named_with_their_file_and_line_and_skipped_the_cut_last_one_as_truncated(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text(LINES)
    named: list[jsonl.BadLine] = []
    assert list(jsonl.records(str(log), named.append)) == [(1, {"step": 0}), (5, {"step": 2})]
    assert [str(line) for line in named] == [
        f"{log}:3: not JSON (Invalid control character at); line skipped",
        f"{log}:4: a list, not a JSON object; line skipped",
        f"{log}:6: not JSON (truncated?) (Unterminated string starting at); line skipped",
    ]


def test_by_default_a_bad_line_is_a_warning_of_the_hooks_logger(tmp_path, caplog):
    log = tmp_path / "log.jsonl"
    log.write_text(LINES)
    logger = logging.getLogger(LOGGER)
    saved = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [caplog.handler], False  # the hooks' logger does not propagate
    try:
        assert [number for number, _ in jsonl.records(str(log))] == [1, 5]
    finally:
        logger.handlers, logger.propagate = saved
    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert [message.split(": ")[0] for message in warned] == [f"{log}:3", f"{log}:4", f"{log}:6"]


def test_a_pairs_file_with_a_bad_line_is_refused_naming_it(tmp_path):
    found = tmp_path / "pairs.jsonl"
    found.write_text('{"train": {"dump": "a/dump.json"}, "generate": {"dump": "b/dump.json"}}\n{"pair": 1, "ru')
    with pytest.raises(pairs.PairsFileError, match=f"^{found}:2: not JSON \\(truncated\\?\\) .*; expected one pair"):
        list(pairs.read(str(found)))
