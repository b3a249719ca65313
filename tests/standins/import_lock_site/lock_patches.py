"""Two patches whose targets import each other's (loaded through MSPROBE_HOOKS_EXTRA_PATCHES).

Patch ``test.lock_a``'s implementation imports ``lock_target_b`` while another thread is inside
that import, whose own hook then applies ``test.lock_b``: the order in which two threads take
patching's lock and an import lock, which deadlocks when patching holds its lock across an
implementation (tests/framework/test_import_lock.py).
"""

from msprobe_hooks.registry import Patch

_DOC = {"why": "test", "how": "test", "retire_when": "never"}

A = Patch("test.lock_a", "lock_target_a", "lock_patch_a", "lock-target", ">=0", **_DOC)
B = Patch("test.lock_b", "lock_target_b", "lock_patch_b", "lock-target", ">=0", **_DOC)
