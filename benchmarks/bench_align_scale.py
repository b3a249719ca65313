"""``align`` over 1 million and 10 million dispatch-log lines: time per line and peak memory, side by side.

    python benchmarks/bench_align_scale.py [MILLIONS ...]      (default: 1 10)

One rollout of 1,000 requests (1,000 training prompt dumps, as ``bench_align.py``), each a single-request
prefill followed by decode steps of the 8 running requests, as many as make the lines asked for (10 million
lines: 10,000 decode steps a request, a long-reasoning rollout): memory must stay flat as the log grows, for
the requests stay the same. The lines are written by the real writers (``dispatch_log.step_line`` through the
process's ``JsonlLog``) into a named pipe that ``align`` reads as its dispatch log, in a fresh interpreter:
10 million lines are ~19 GB, more than this disk has to spare. Prints, per size: the pairs, align's CPU time
per line and in all, the wall time (the writer runs beside it), and align's peak resident memory; no
pass/fail.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_align import REQUESTS, prompt_hashes, write_dispatch, write_training

from msprobe_hooks.analysis.layout import find_logs
from msprobe_hooks.join_keys import DISPATCH_LOG, TRAINING_LOG

MILLIONS = (1, 10)
PIPE_BYTES = 2**20  # Linux's largest for an unprivileged process (/proc/sys/fs/pipe-max-size)
READER = """
import resource, sys, time
from msprobe_hooks.analysis.pairing import align
out, fifo, *train = sys.argv[1:]
start = time.process_time()
result = align.pair_logs(train, [fifo], out)
cpu = time.process_time() - start
print(len(result.pairs), result.generate_total, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _writer(generate: str, decodes: int, ready: multiprocessing.connection.Connection) -> None:
    """The inference process: its log made a named pipe where the writer puts it, then every line written."""
    fifo = Path(generate) / str(os.getpid()) / DISPATCH_LOG
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    ready.send(str(fifo))
    write_dispatch(generate, prompt_hashes(REQUESTS), decodes)  # opening the pipe waits for align to read it


def run(root: Path, lines: int) -> tuple[int, int, float, float, float]:
    """(pairs, generate dumps, align's CPU seconds, wall seconds, align's peak RSS in MB) for ``lines`` lines."""
    train, generate = root / "actor", root / "generate"
    write_training(str(train), prompt_hashes(REQUESTS))
    decodes = lines // REQUESTS - 1  # each request: its prefill line and its decode lines
    receive, send = multiprocessing.Pipe(duplex=False)
    writer = multiprocessing.get_context("fork").Process(target=_writer, args=(str(generate), decodes, send))
    writer.start()
    fifo = receive.recv()
    held = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # while held, the pipe keeps the larger buffer set here:
    fcntl.fcntl(held, fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # fewer switches between the writer and align
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", READER, str(root), fifo, *find_logs(str(train), TRAINING_LOG)],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    writer.join()
    os.close(held)
    paired, dumps, cpu, peak = done.stdout.split()
    return int(paired), int(dumps), float(cpu), wall, int(peak) / 1024


def main() -> int:
    millions = [float(m) for m in sys.argv[1:]] or list(MILLIONS)
    print(f"{REQUESTS} requests, 8 running per decode step; load average {os.getloadavg()[0]:.2f}")
    print(f"{'lines':>11} {'pairs':>6} {'align CPU s':>12} {'us/line':>8} {'wall s':>7} {'peak RSS MB':>12}")
    for m in millions:
        lines = int(m * 1_000_000)
        with tempfile.TemporaryDirectory(prefix="bench-align-scale-") as root:
            paired, _, cpu, wall, peak = run(Path(root), lines)
        print(f"{lines:>11,} {paired:>6} {cpu:>12.1f} {cpu / lines * 1e6:>8.2f} {wall:>7.1f} {peak:>12.0f}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
