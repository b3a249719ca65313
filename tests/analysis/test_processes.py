"""compare's processes: pairs in a pool and the figures in a second process give the report one process gives.

The pool starts only from :data:`pool.PAIRS_PER_PROCESS` pairs a worker, the painter forks before the pairs
are compared; neither may change a byte of the tables or lose a figure, and a figure that fails to draw in
the painter's process fails the command as it would in this one.
"""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

import pytest
from support import golden

from msprobe_hooks.analysis.comparing import pool
from msprobe_hooks.analysis.pairing import pairs
from msprobe_hooks.analysis.report import plots
from msprobe_hooks.cli import main

TABLES = ("summary.md", "modules.csv", "pairs.csv")
FIGURES = ("error_by_depth.png",)


def many_pairs(tmp_path: Path, copies: int) -> Path:
    """The golden FSDP2-vLLM pairs, ``copies`` times over (numbered apart): enough pairs for a pool."""
    aligned = tmp_path / "two.jsonl"
    train, generate = golden.GOLDEN / "fsdp2/actor", golden.GOLDEN / "vllm/generate"
    assert main(["align", str(train), str(generate), "-o", str(aligned)]) == 0
    found = list(pairs.read(str(aligned)))
    repeated = [dataclasses.replace(p, pair=i) for i, p in enumerate(found * copies)]
    out = tmp_path / "many.jsonl"
    pairs.write(repeated, str(out))
    return out


def test_a_pool_and_the_painter_give_the_report_of_one_process(tmp_path):
    copies = pool.PAIRS_PER_PROCESS  # 2 prompts x copies: two workers' worth of pairs
    pairs_file = many_pairs(tmp_path, copies)
    assert main(["compare", str(pairs_file), "-o", str(tmp_path / "one"), "--jobs", "1"]) == 0
    assert main(["compare", str(pairs_file), "-o", str(tmp_path / "two"), "--jobs", "2"]) == 0
    assert gc.isenabled()  # compare turns the collector off while it runs, and on again
    for name in TABLES:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    for name in FIGURES:
        assert (tmp_path / "two" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_few_pairs_are_compared_without_a_pool(tmp_path, monkeypatch):
    def no_pool(*args, **kwargs):
        raise AssertionError("a process pool was started for fewer pairs than it pays for")

    monkeypatch.setattr(pool, "ProcessPoolExecutor", no_pool)
    pairs_file = many_pairs(tmp_path, 1)
    assert main(["compare", str(pairs_file), "-o", str(tmp_path / "report"), "--jobs", "2"]) == 0


def _broken_figure(path: str) -> None:
    raise ValueError(f"cannot draw {path}")


@pytest.mark.parametrize("separate_process", [False, True])
def test_a_figure_that_fails_to_draw_fails_where_it_would_in_this_process(separate_process):
    painter = plots.Painter(separate_process=separate_process)
    with pytest.raises(ValueError, match="cannot draw x.png"):
        painter.draw(_broken_figure, "x.png")  # in this process: raises here; in the painter's: at finish
        painter.finish()
