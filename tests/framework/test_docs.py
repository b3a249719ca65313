"""The generated reference pages match the code they are generated from."""

from __future__ import annotations

import subprocess
import sys

from support import REPO


def test_generated_docs_are_current():
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_docs.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
