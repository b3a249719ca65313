"""The patch catalogue: every built-in patch, as a declarative record.

Each record says what it patches (target module and symbols, through its contract), why, how,
and which upstream change would make it unnecessary, in the manner of vLLM-Ascend's
``patch/__init__.py``. The code of a patch lives in the module named by ``implementation`` and is
imported only when its target is. ``docs/patches.md`` (``python scripts/gen_docs.py``) and ``msprobe-hooks doctor``
are generated from this tuple.
"""

from __future__ import annotations

from ..registry import Patch

PATCHES: tuple[Patch, ...] = ()
