"""The catalogue: every built-in patch record, in the order they apply, and the list a process registers."""

from __future__ import annotations

from msprobe_hooks.patches import sglang, verl, vllm
from msprobe_hooks.registry import Patch

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: activation stays light
if TYPE_CHECKING:
    from collections.abc import Iterable

PATCHES: tuple[Patch, ...] = verl.PATCHES + sglang.PATCHES + vllm.PATCHES


def load_extra(refs: Iterable[str]) -> list[Patch]:
    """Resolve ``module:attribute`` references (MSPROBE_HOOKS_EXTRA_PATCHES) to Patch records."""
    found: list[Patch] = []
    for ref in refs:
        from importlib import import_module  # here: activation stays light when there are none

        module_name, _, attribute = ref.partition(":")
        value = import_module(module_name)
        for part in attribute.split("."):
            value = getattr(value, part)
        records = [value] if isinstance(value, Patch) else list(value)
        for record in records:
            if not isinstance(record, Patch):
                raise TypeError(f"{ref} holds {type(record).__name__}, not msprobe_hooks.registry.Patch")
        found.extend(records)
    return found


def all_patches(extra_refs: Iterable[str] = ()) -> list[Patch]:
    """The catalogue followed by the extra ones; names must be unique."""
    patches = list(PATCHES) + load_extra(extra_refs)
    seen: set[str] = set()
    for record in patches:
        if record.name in seen:
            raise ValueError(f"two patches are named {record.name!r}")
        seen.add(record.name)
    return patches
