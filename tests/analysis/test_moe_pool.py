"""The routing comparison through compare's process pool: spawned workers (torch has run in this process), the
rows they send back, the report one process writes. Spawned workers are fresh interpreters: this tier."""

from __future__ import annotations

import json

import pytest
from support import golden

from msprobe_hooks.analysis.report.routing import ROUTING_CSV
from msprobe_hooks.cli import main

pytestmark = pytest.mark.interpreter  # spawns worker interpreters (make test-fast leaves it out)

MOE = golden.GOLDEN / "moe"
MOE_LAYERS = 3


def test_the_routing_comparison_comes_back_from_a_process_pool(tmp_path):
    """Eight pairs on two workers (a pool: ``pool.PAIRS_PER_PROCESS`` pairs a worker): the routing rows travel
    with their results and the report is the one a single process writes."""
    found = tmp_path / "pairs.jsonl"
    assert main(["align", str(MOE / "actor"), str(MOE / "router" / "generate"), "-o", str(found)]) == 0
    lines = found.read_text().splitlines()
    many = tmp_path / "many.jsonl"
    many.write_text("".join(json.dumps({**json.loads(lines[i % 2]), "pair": i}) + "\n" for i in range(8)))
    tables = []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}"
        assert main(["compare", str(many), "-o", str(out), "--jobs", jobs]) == 0
        tables.append((out / ROUTING_CSV).read_text())
    assert tables[0] == tables[1] and len(tables[0].splitlines()) == 1 + 8 * MOE_LAYERS
