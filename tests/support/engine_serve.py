"""The serve protocol of the real-engine children (``real_*_child.py``), read by ``benchmarks/engine_rounds.py``.

``SERVE ready`` once the engine is up; then one generation per ``go`` line on stdin, answered with
``SERVE <wall seconds>``. Engines log to stdout too, hence the prefix. Stdlib only: it runs in
every engine venv.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

SERVE = "SERVE"


def serve(generate_once: Callable[[], object]) -> None:
    """Answer ``go`` lines with the wall time of ``generate_once()`` until stdin ends or says otherwise."""
    print(f"{SERVE} ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        began = time.perf_counter()
        generate_once()
        print(f"{SERVE} {time.perf_counter() - began:.6f}", flush=True)
