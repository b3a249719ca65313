"""What a report page loads (it must open offline, with every resource inline), and what it opens with (the
answer first)."""

from __future__ import annotations

import html
import json
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


def printed_verdicts(printed: str) -> list[str]:
    """The verdict lines ``compare`` printed (from "N pairs: ..." to its first line per pair), the first without
    its "N pairs: "."""
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\d+ pairs: ", line))
    head = lines[start : next(i for i, line in enumerate(lines) if line.startswith("  pair "))]
    return [head[0].split(": ", 1)[1], *head[1:]]


def assert_answer_first(report: Path, printed: str) -> None:
    """``summary.md`` and ``index.html`` open with the verdict lines compare printed, right under the title, before
    the notes and everything else."""
    verdicts = printed_verdicts(printed)
    paragraphs = (report / "summary.md").read_text().split("\n\n")
    assert paragraphs[0].startswith("# compare: ")
    assert paragraphs[1 : 1 + len(verdicts)] == [f"**{line}**" for line in verdicts]
    assert paragraphs[1 + len(verdicts)].startswith("- Threshold: ")  # then the notes
    page = (report / "index.html").read_text()
    after_title = page.split("</h1>\n", 1)[1]
    opening = "".join(f"<p><strong>{html.escape(line)}</strong></p>\n" for line in verdicts)
    assert after_title.startswith(opening + "<ul><li>Threshold: ")


def plotted(page: str, div_id: str) -> tuple[list, dict]:
    """The traces and the layout of the page's plotly figure ``div_id``, as its script hands them to plotly.js."""
    decoder = json.JSONDecoder()
    call = re.search(rf'Plotly\.newPlot\(\s*"{div_id}",\s*', page)
    assert call, f"no plotly figure {div_id} on the page"
    at = call.end()
    traces, at = decoder.raw_decode(page, at)
    layout, _ = decoder.raw_decode(page, page.index("{", at))
    return traces, layout
