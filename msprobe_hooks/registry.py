"""The patch record.

A :class:`Patch` is declarative: it names the module whose import triggers it, the distribution
and versions it supports, the contract it relies on, and the module holding the code. The
built-in records, and the list a process registers, are :mod:`msprobe_hooks.patches`' (the
catalogue that ``doctor`` and ``docs/patches.md`` read).
"""

from __future__ import annotations

from msprobe_hooks.contracts import ContractItem
from msprobe_hooks.record import Record


class Patch(Record):
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
