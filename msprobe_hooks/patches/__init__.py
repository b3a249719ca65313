"""The patch catalogue: every built-in patch, as a declarative record, in the order they apply.

Each engine's records live in its own folder beside the code they name (``patches/verl``,
``patches/vllm``, ``patches/sglang``), in the manner of vLLM-Ascend's ``patch/__init__.py``: what
each patches (target module and symbols, through its contract), why, how, and which upstream change
would make it unnecessary. The code of a patch is imported only when its target is.
``docs/patches.md`` (``python scripts/gen_docs.py``) and ``msprobe-hooks doctor`` are generated from
:data:`PATCHES` (:mod:`.catalogue`).
"""

from msprobe_hooks.patches.catalogue import PATCHES, all_patches, load_extra

__all__ = ["PATCHES", "all_patches", "load_extra"]
