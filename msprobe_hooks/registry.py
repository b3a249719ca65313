"""The patch record, and the list of patches a process registers.

A :class:`Patch` is declarative: it names the module whose import triggers it, the distribution
and versions it supports, the contract it relies on, and the module holding the code. The
built-in records live in :mod:`msprobe_hooks.patches` (the catalogue that ``doctor`` and
``docs/patches.md`` read); importing the catalogue imports none of the patch code and none of
the targets.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import NamedTuple

from msprobe_hooks.contracts import ContractItem


class Patch(NamedTuple):
    """One patch: target, versions, contract, code, and why it exists.

    ``implementation`` names a module with ``patch(module, ctx)``, called with the imported
    ``target`` module and a :class:`msprobe_hooks.patching.PatchContext`; what it wraps through
    ``ctx.wrap`` is reverted by the framework. (A site's own module may instead have
    ``patch(module)`` and ``unpatch(module)``.) It is imported only when the target is. ``ran_for_real`` names
    the releases whose real engine the test suite runs this patch in (the others rest on contracts
    read from the released files and on stand-ins).
    """

    name: str
    target: str
    implementation: str
    distribution: str
    versions: str
    why: str
    how: str
    retire_when: str
    contract: tuple[ContractItem, ...] = ()
    ran_for_real: tuple[str, ...] = ()


def builtin_patches() -> tuple[Patch, ...]:
    from msprobe_hooks.patches import PATCHES

    return PATCHES


def load_extra(refs: Iterable[str]) -> list[Patch]:
    """Resolve ``module:attribute`` references (MSPROBE_HOOKS_EXTRA_PATCHES) to Patch records."""
    found: list[Patch] = []
    for ref in refs:
        module_name, _, attribute = ref.partition(":")
        value = importlib.import_module(module_name)
        for part in attribute.split("."):
            value = getattr(value, part)
        records = [value] if isinstance(value, Patch) else list(value)  # type: ignore[call-overload]
        for record in records:
            if not isinstance(record, Patch):
                raise TypeError(f"{ref} holds {type(record).__name__}, not msprobe_hooks.registry.Patch")
        found.extend(records)
    return found


def all_patches(extra_refs: Iterable[str] = ()) -> list[Patch]:
    """Built-in patches followed by the extra ones; names must be unique."""
    patches = list(builtin_patches()) + load_extra(extra_refs)
    seen: set[str] = set()
    for record in patches:
        if record.name in seen:
            raise ValueError(f"two patches are named {record.name!r}")
        seen.add(record.name)
    return patches
