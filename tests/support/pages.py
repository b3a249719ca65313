"""What a report page loads: it must open offline, with every resource inline."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

# A tag that makes the browser fetch something: a script, a stylesheet, an image, a frame, a font from a URL.
_FETCHING = re.compile(
    r"""<(?:script|img|iframe|link|source|video|audio)\b[^>]*\b(?:src|href)\s*=\s*["']?(?:https?:)?//""", re.I
)
_CSS_URL = re.compile(r"""url\(\s*["']?(?:https?:)?//""", re.I)


def offline(page: str) -> bool:
    """Whether ``page`` loads nothing from the network (the plotly bundle's own URL strings are data, not loads)."""
    return _FETCHING.search(page) is None and _CSS_URL.search(page) is None


def rendered(index: Path, budget_ms: int = 20000) -> str:
    """The DOM of ``index`` after headless Chromium ran its scripts (``make chromium`` installs it)."""
    chromium = shutil.which("chromium")
    assert chromium, "chromium is not on PATH: make test installs it (make chromium)"
    done = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--virtual-time-budget={budget_ms}",
         "--dump-dom", index.as_uri()],
        capture_output=True, text=True, timeout=180, check=True,
    )  # fmt: skip
    return done.stdout


def figures_drawn(dom: str) -> int:
    """How many plotly figures the browser drew: plotly.js adds each one's container when it draws it (the
    page as written holds none)."""
    return dom.count('class="plot-container plotly"')
