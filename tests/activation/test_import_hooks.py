"""Post-import hooks: once, after the module ran, transparent to the module, for packages too."""

from __future__ import annotations

import pytest
from support.interpreter import clean_env, run_python

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

CODE = """
import importlib.machinery, json, sys
from msprobe_hooks.import_hooks import when_imported

seen = []
def hook(module):
    seen.append([module.__name__, getattr(module, "DONE", False)])

when_imported("pkg.sub", hook)
when_imported("pkg.sub", hook)          # two hooks on one module both run
when_imported("json", hook)             # already imported: runs at once
import pkg.sub
import pkg.sub                          # a second import runs nothing
del sys.modules["pkg.sub"]
import pkg.sub                          # nor does a re-import: hooks run once
print(json.dumps({
    "seen": seen,
    "loader": type(pkg.sub.__loader__).__name__,
    "spec_loader": type(pkg.sub.__spec__.loader).__name__,
}))
"""


def test_hooks_run_once_after_the_module_executed_and_leave_its_loader_alone(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub.py").write_text("DONE = True\n")
    result = run_python(CODE, clean_env(PYTHONPATH=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    report = result.json()
    # json has no DONE: it was already imported, so its hook ran at registration; pkg.sub's ran after its body.
    assert report["seen"] == [["json", False], ["pkg.sub", True], ["pkg.sub", True]]
    assert report["loader"] == report["spec_loader"] == "SourceFileLoader"


def test_a_raising_hook_fails_that_import_as_wraps_strict_mode_relies_on(tmp_path):
    (tmp_path / "victim.py").write_text("X = 1\n")
    code = """
from msprobe_hooks.import_hooks import when_imported
def hook(module):
    raise RuntimeError("hook failed")
when_imported("victim", hook)
try:
    import victim
except RuntimeError as exc:
    print("raised:", exc)
"""
    result = run_python(code, clean_env(PYTHONPATH=str(tmp_path)))
    assert result.stdout.strip() == "raised: hook failed"
