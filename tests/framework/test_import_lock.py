"""Two threads importing two hooked targets at once never deadlock (issue 12, item 4).

Thread A imports ``lock_target_a``; its hook applies ``test.lock_a``, whose ``patch`` imports
``lock_target_b``. Thread B is already inside ``lock_target_b``'s import (holding that module's
import lock), and its hook applies ``test.lock_b`` once the body has run. Events order the two
(tests/standins/import_lock_site/lock_sync.py): if patching held its lock while running
``test.lock_a``, thread B would wait for it while thread A waits for B's import: both stuck.
"""

from __future__ import annotations

import pytest
from support import STANDINS
from support.interpreter import run_python, shim_env

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

SITE = STANDINS / "import_lock_site"

CODE = """
import json, os, sys, threading
import lock_sync
import msprobe_hooks

def importer(name):
    return threading.Thread(target=__import__, args=(name,), name=name, daemon=True)

threads = [importer("lock_target_b"), importer("lock_target_a")]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(30)
report = {"stuck": [thread.name for thread in threads if thread.is_alive()]}
if not report["stuck"]:  # else patching's lock may be held for good: status() would wait on it
    report["applied"] = sorted(lock_sync.applied)
    report["status"] = {s.name: s.state for s in msprobe_hooks.status() if s.name.startswith("test.")}
print(json.dumps(report), flush=True)
os._exit(0)  # a stuck thread holds import locks that interpreter shutdown would wait on
"""


def test_two_threads_importing_two_hooked_targets_at_once_both_finish_and_each_patch_applies_once():
    env = shim_env(SITE, DUMP_ON="1", MSPROBE_HOOKS_EXTRA_PATCHES="lock_patches:A,lock_patches:B")
    result = run_python(CODE, env, timeout=180)
    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["stuck"] == []
    assert report["applied"] == ["test.lock_a", "test.lock_b"]
    assert report["status"] == {"test.lock_a": "applied", "test.lock_b": "applied"}
