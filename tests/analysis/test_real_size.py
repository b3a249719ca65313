"""A smaller variant of the real-size benchmark (``benchmarks/bench_real_size.py``) through the whole loop.

Qwen2.5-0.5B's widths (hidden 896, 14 query heads and 2 KV heads of 64, MLP 4864, vocabulary 151,936), random,
made here, cut to 2 layers: verl's FSDP2 prompt-only dumps, vLLM's prefill dumps, align, compare. The
24-layer model, its timings and memory are the benchmark's (``make bench``); here only what must hold.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from support import REPO

from msprobe_hooks.analysis.results import Verdict

# runs a real engine (make test-fast leaves it out), a real-size one: with no other engine test beside it
pytestmark = [pytest.mark.engine, pytest.mark.alone]

LAYERS = 2


def _bench():
    spec = importlib.util.spec_from_file_location("bench_real_size", REPO / "benchmarks" / "bench_real_size.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_real_widths_go_through_the_loop(tmp_path: Path) -> None:
    found = _bench().run(tmp_path, prompts=2, prompt_len=16, layers=LAYERS)
    assert found["pairs"] == 2
    assert found["verdict"] == Verdict.NO_DIVERGENCE.value  # the same weights, fp32 on both sides
    assert found["compared"] == 19 * LAYERS + 4  # every module of every layer, as on the tiny models
    for side in ("training", "vllm"):
        seconds, size = found[side]
        assert seconds > 0 and size > 0
