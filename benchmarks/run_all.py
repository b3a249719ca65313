"""Every benchmark in one run, one section each (``make bench``).

Each ``bench_*.py`` here is a script that prints its own section: medians and ratios, never
pass/fail. They run one after another, each in its own interpreter, so that one benchmark's
imports (torch, msprobe's global API hooks) cannot slow another down.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    failed = []
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"== {script.stem}", flush=True)
        if subprocess.run([sys.executable, str(script)], cwd=HERE.parent).returncode != 0:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
