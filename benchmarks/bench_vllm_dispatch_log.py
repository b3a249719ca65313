"""Cost of the vLLM dispatch log per model step (no msprobe dump: the log alone).

Drives the stand-in V1 runner's ``_update_states`` (tests/standins/vllm_site) with decode steps of N running
requests whose prompts are 1024 tokens, with the ``vllm.model_runner`` patch applied and after it is
reverted, and prints medians: microseconds per step, per request row (target <= 1 us), and the
ratio. A request's id and prompt hash are read once (its first step), so a decode step pays for
reading the batch's columns and handing them to the writer thread, which builds and writes the
line off the step (``bench_real_vllm`` times that thread too). Absolute times are of this machine; the
stand-in's own ``_update_states`` is much lighter than vLLM's, so the ratio overstates the share of
a real step (a real decode step of 64 requests takes milliseconds on a GPU).

The second table has every step bring K new requests (whole 1024-token prefills; the last step's are freed):
what a request costs once, at its first step (its dispatch-log row, prompt hash and the JSON kept for its later
rows, and its ``requests.jsonl`` line with the prompt's ids), per new request, and the ``requests.jsonl`` line's
share alone (the same patched runner with that line not written).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STANDINS = REPO / "tests" / "standins" / "vllm_site"
PROMPT_LEN = 1024
REPEATS = 200


def _site() -> str:
    site = Path(tempfile.mkdtemp(prefix="bench-vllm-site-"))
    info = site / "vllm-0.23.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.23.0\n")
    return str(site)


def _steps(n: int):
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    ids = [f"req-{i:04d}-0123abcd" for i in range(n)]
    prompts = {rid: list(range(i, i + PROMPT_LEN)) for i, rid in enumerate(ids)}
    prefill = SchedulerOutput(
        scheduled_new_reqs=[NewRequestData(rid, prompts[rid], None, ([],), 0) for rid in ids],
        scheduled_cached_reqs=CachedRequestData.make_empty(),
        num_scheduled_tokens={rid: PROMPT_LEN for rid in ids},
        total_num_scheduled_tokens=n * PROMPT_LEN,
    )

    def decode(step: int):
        cached = CachedRequestData(list(ids), set(), [[]] * n, [None] * n, [PROMPT_LEN + step] * n)
        return SchedulerOutput([], cached, {rid: 1 for rid in ids}, n)

    return prefill, decode


def _time_decode(runner, decode) -> float:
    samples = []
    for step in range(REPEATS):
        scheduler_output = decode(step)
        start = time.perf_counter()
        runner._update_states(scheduler_output)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def _arrivals(k: int):
    """Scheduler outputs whose K requests are all new (fresh ids and prompts), the previous step's freed."""
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
    from vllm.v1.request import SamplingParams

    params = SamplingParams(temperature=0.7, top_p=0.9)
    outputs = []
    previous: set[str] = set()
    for step in range(REPEATS):
        ids = [f"new-{step:04d}-{i:03d}-0123abcd" for i in range(k)]
        new = [NewRequestData(rid, list(range(i, i + PROMPT_LEN)), params, ([],), 0) for i, rid in enumerate(ids)]
        empty = CachedRequestData.make_empty()
        outputs.append(
            SchedulerOutput(new, empty, dict.fromkeys(ids, PROMPT_LEN), k * PROMPT_LEN, finished_req_ids=previous)
        )
        previous = set(ids)
    return outputs


def _time_arrivals(runner, outputs) -> float:
    samples = []
    for scheduler_output in outputs:
        start = time.perf_counter()
        runner._update_states(scheduler_output)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def _runner(config):
    import torch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = GPUModelRunner(config, torch.device("cpu"))
    runner.load_model()  # the engine.jsonl line is written at the first step, from the loaded model
    return runner


def main() -> int:
    out = tempfile.mkdtemp(prefix="bench-vllm-out-")
    os.environ.update({"DUMP_ON": "1", "MSPROBE_HOOKS_OUTPUT_DIR": out, "MSPROBE_HOOKS_LOG_LEVEL": "WARNING"})
    sys.path[:0] = [_site(), str(STANDINS)]
    import msprobe_hooks
    from msprobe_hooks import bootstrap

    msprobe_hooks.activate()
    from vllm.config import SchedulerConfig, VllmConfig

    from msprobe_hooks.patches.vllm import evidence

    record_requests = evidence.record_requests

    print(f"decode steps, prompts of {PROMPT_LEN} tokens, median of {REPEATS}")
    print(f"{'requests':>9} {'patched us':>11} {'plain us':>9} {'us/row':>7} {'ratio':>6}")
    for n in (8, 64, 256):
        config = VllmConfig(scheduler_config=SchedulerConfig(max_num_seqs=n))
        config.model_config.max_model_len = PROMPT_LEN + REPEATS + 1
        prefill, decode = _steps(n)
        patched_runner = _runner(config)
        patched_runner._update_states(prefill)
        patched = _time_decode(patched_runner, decode)
        bootstrap.deactivate()
        plain_runner = _runner(config)
        plain_runner._update_states(prefill)
        plain = _time_decode(plain_runner, decode)
        print(f"{n:>9} {patched:>11.1f} {plain:>9.1f} {(patched - plain) / n:>7.2f} {patched / plain:>6.2f}")
        msprobe_hooks.activate()

    print(f"\nsteps of K new requests only, prompts of {PROMPT_LEN} tokens, median of {REPEATS}")
    print(f"{'K':>9} {'patched us':>11} {'plain us':>9} {'us/new request':>15} {'of which requests.jsonl':>24}")
    for k in (1, 8, 32):
        config = VllmConfig(scheduler_config=SchedulerConfig(max_num_seqs=k))
        config.model_config.max_model_len = PROMPT_LEN + 1
        patched = _time_arrivals(_runner(config), _arrivals(k))
        evidence.record_requests = lambda state, new: None  # the same patched runner, its request lines not written
        without_lines = _time_arrivals(_runner(config), _arrivals(k))
        evidence.record_requests = record_requests
        bootstrap.deactivate()
        plain = _time_arrivals(_runner(config), _arrivals(k))
        msprobe_hooks.activate()
        per_request, lines = (patched - plain) / k, (patched - without_lines) / k
        print(f"{k:>9} {patched:>11.1f} {plain:>9.1f} {per_request:>15.2f} {lines:>24.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
