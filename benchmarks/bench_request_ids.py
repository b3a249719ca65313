"""Cost of the request-id patches per rollout ``generate`` call (CPU, no Ray).

verl's real ``LLMServerClient.generate`` against an in-process stand-in server, with and without
the patches. In a job each call is a Ray RPC to an inference engine (milliseconds at least), so
what matters is the absolute added time per call, printed in microseconds.

    python benchmarks/bench_request_ids.py [calls]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "standins" / "verl_standins"))

from verl.workers.rollout.llm_server import LLMServerClient  # noqa: E402
from verl_standins import Handle, LoadBalancer, RolloutServer, activated, job_config  # noqa: E402


def per_call_us(calls: int) -> float:
    server = RolloutServer()
    client = LLMServerClient(job_config("unused"), load_balancer_handle=Handle(LoadBalancer(Handle(server))))

    async def run() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            await client.generate("session", prompt_ids=[5, 6, 7], sampling_params={})
        return time.perf_counter() - start

    return asyncio.run(run()) / calls * 1e6


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    per_call_us(1000)  # warm-up
    plain = min(per_call_us(calls) for _ in range(3))
    with activated():
        patched = min(per_call_us(calls) for _ in range(3))
    print(f"generate, unpatched: {plain:.1f} us/call")
    print(f"generate, patched:   {patched:.1f} us/call")
    print(f"added: {patched - plain:.1f} us/call (ratio {patched / plain:.2f}x of an in-process call)")


if __name__ == "__main__":
    main()
