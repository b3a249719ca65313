"""Cost of the SGLang dispatch log per forward, outside any dump window (no debugger).

What the patches add to one ``ModelRunner.forward`` when only the dispatch log is on: the
request identities taken in ``ForwardBatch.init_new`` (prompt hash once per request, a lookup
after) and the row building in ``forward``, whose line the writer thread builds and writes off the
forward (``bench_real_vllm`` times that thread in a real engine). Batches are
ForwardBatch-shaped objects, so SGLang is not needed; numbers are CPU microseconds per forward,
and both together per request row (the figure that scales with the batch: target <= 1 us on a
decode step).

    python benchmarks/bench_sglang_dispatch_log.py
"""

from __future__ import annotations

import statistics
import tempfile
import time
from types import SimpleNamespace

import torch

from msprobe_hooks.inference import dispatch_log
from msprobe_hooks.jsonl import flush
from msprobe_hooks.patches.sglang import model_runner as sglang_model_runner
from msprobe_hooks.patches.sglang.forward_batch import REQUESTS_ATTR, identities

Mode = SimpleNamespace(EXTEND=SimpleNamespace(name="EXTEND"), DECODE=SimpleNamespace(name="DECODE"))


def _reqs(count: int, prompt_len: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(rid=f"req-{i}", origin_input_ids=list(range(prompt_len))) for i in range(count)]


def _forward_batch(reqs, prefill: bool, prompt_len: int) -> SimpleNamespace:
    n = len(reqs)
    return SimpleNamespace(
        forward_mode=Mode.EXTEND if prefill else Mode.DECODE,
        batch_size=n,
        extend_seq_lens_cpu=[prompt_len] * n if prefill else None,
        extend_prefix_lens_cpu=[0] * n if prefill else None,
        seq_lens_cpu=torch.full((n,), prompt_len + 5),
        rids=None,
    )


def _per_forward_us(runner, reqs, prefill: bool, prompt_len: int, repeat: int) -> tuple[float, float]:
    """Median microseconds per forward: (identities in init_new, begin + end in forward)."""
    ident, log = [], []
    for _ in range(repeat):
        batch = _forward_batch(reqs, prefill, prompt_len)
        t0 = time.perf_counter()
        setattr(batch, REQUESTS_ATTR, identities(reqs))
        t1 = time.perf_counter()
        runner.end(runner.begin(None, batch))
        t2 = time.perf_counter()
        ident.append(t1 - t0)
        log.append(t2 - t1)
    return statistics.median(ident) * 1e6, statistics.median(log) * 1e6


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="sglang-dispatch-bench-") as root:
        _table(root)


def _table(root: str) -> None:
    runner = sglang_model_runner.SglangRunner(
        None, own=False, dump_all=False, rank_id=0, engine_version="0.5.2", log=dispatch_log.open_log(root)
    )
    print(f"{'batch':>28} {'init_new us':>12} {'forward us':>11} {'us/row':>7} {'line bytes':>11}")
    for label, count, prompt_len, prefill in [
        ("prefill 1 x 2048 (new)", 1, 2048, True),
        ("prefill 8 x 2048 (new)", 8, 2048, True),
        ("decode 1", 1, 2048, False),
        ("decode 64", 64, 2048, False),
        ("decode 256", 256, 2048, False),
    ]:
        if prefill:  # new requests every time: the prompt hash is computed in each forward
            times = [_per_forward_us(runner, _reqs(count, prompt_len), True, prompt_len, 1) for _ in range(20)]
            ident, log = (statistics.median(t[i] for t in times) for i in (0, 1))
        else:  # running requests: their prompt hashes were computed at their prefill
            reqs = _reqs(count, prompt_len)
            identities(reqs)
            ident, log = _per_forward_us(runner, reqs, False, prompt_len, 200)
        flush()  # the lines still waiting for the writer thread
        with open(runner.log.path, "rb") as handle:
            line = handle.read().splitlines()[-1]
        print(f"{label:>28} {ident:12.1f} {log:11.1f} {(ident + log) / count:7.2f} {len(line):11d}")


if __name__ == "__main__":
    main()
