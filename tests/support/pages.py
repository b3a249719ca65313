"""What a report page loads: it must open offline, with every resource inline."""

from __future__ import annotations

import re

# A tag that makes the browser fetch something: a script, a stylesheet, an image, a frame, a font from a URL.
_FETCHING = re.compile(
    r"""<(?:script|img|iframe|link|source|video|audio)\b[^>]*\b(?:src|href)\s*=\s*["']?(?:https?:)?//""", re.I
)
_CSS_URL = re.compile(r"""url\(\s*["']?(?:https?:)?//""", re.I)


def offline(page: str) -> bool:
    """Whether ``page`` loads nothing from the network (the plotly bundle's own URL strings are data, not loads)."""
    return _FETCHING.search(page) is None and _CSS_URL.search(page) is None
