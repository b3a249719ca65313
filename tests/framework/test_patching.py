"""Lazy, guarded, idempotent, revertible patches, driven through the real shim in fresh interpreters.

The target is ``tests/standins/fake_site/fake_target`` (distribution ``fake-target`` 1.2.0); the test
patches are registered through MSPROBE_HOOKS_EXTRA_PATCHES, as a site-specific patch would be.
"""

from __future__ import annotations

import pytest
from support import STANDINS
from support.interpreter import run_python, shim_env

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

SITE = STANDINS / "fake_site"

STATE = """
import json, sys
import msprobe_hooks
from msprobe_hooks.patching import is_ours

def depth(func):
    n = 0
    while is_ours(func, "test.fake_engine"):
        n, func = n + 1, func.__wrapped__
    return n

def state():
    target = sys.modules.get("fake_target")
    impl = sys.modules.get("fake_patches_impl")
    return {
        "status": {s.name: [s.state, s.reason] for s in msprobe_hooks.status() if s.name.startswith("test.")},
        "depth": depth(vars(target.Engine)["step"]) if target else None,
        "calls": len(impl.CALLS) if impl else None,
        "imports": int(__import__("os").environ.get("FAKE_TARGET_IMPORTS", "0")),
    }
"""


def env(patches: str = "fake_patches:GOOD", **extra: str) -> dict[str, str]:
    return shim_env(SITE, **{"DUMP_ON": "1", "MSPROBE_HOOKS_EXTRA_PATCHES": patches, **extra})


def run(code: str, environment: dict[str, str]) -> dict:
    result = run_python(STATE + code + "\nprint(json.dumps(state()))", environment)
    assert result.returncode == 0, result.stderr
    return result.json()


def test_the_patch_waits_for_its_target_and_imports_nothing_before():
    result = run("assert 'fake_target' not in sys.modules and 'fake_patches_impl' not in sys.modules", env())
    assert result["status"]["test.fake_engine"] == ["waiting", "until fake_target is imported"]
    assert {state for state, _ in result["status"].values()} == {"waiting"}  # the built-in patches wait too


def test_activate_then_import_applies_once_and_the_wrapper_passes_results_and_errors_through():
    code = """
import fake_target
engine = fake_target.Engine()
assert engine.step(21) == 42
try:
    engine.step(None)
except ValueError as exc:
    assert str(exc) == "no batch"
else:
    raise AssertionError("the wrapped exception was swallowed")
"""
    result = run(code, env())
    assert result["status"]["test.fake_engine"][0] == "applied"
    assert result["depth"] == 1
    assert result["calls"] == 2


def test_import_then_activate_applies_at_once():
    code = """
import os
import fake_target
assert msprobe_hooks.current_config() is None
os.environ["DUMP_ON"] = "1"
msprobe_hooks.activate()
fake_target.Engine().step(1)
"""
    result = run(code, env(DUMP_ON="0"))
    assert result["status"]["test.fake_engine"][0] == "applied"
    assert (result["depth"], result["calls"]) == (1, 1)


def test_double_activation_never_double_wraps():
    code = """
import fake_target
msprobe_hooks.activate()
msprobe_hooks.bootstrap._active = None  # forget the flag: registration must still be idempotent
msprobe_hooks.activate()
fake_target.Engine().step(1)
"""
    result = run(code, env())
    assert (result["depth"], result["calls"]) == (1, 1)
    assert result["status"]["test.fake_engine"][0] == "applied"


def test_a_hook_registered_before_unpatch_all_never_fires_after_it():
    code = """
msprobe_hooks.deactivate()
import fake_target
"""
    result = run(code, env())
    assert result["depth"] == 0 and result["status"] == {}


def test_the_same_patch_twice_on_the_path_never_double_wraps():
    code = """
import fake_target, fake_patches_impl
fake_patches_impl.patch(fake_target)
fake_patches_impl.patch(fake_target)
"""
    assert run(code, env())["depth"] == 1


def test_unpatch_restores_the_original_and_a_reimport_is_not_patched_until_reactivation():
    code = """
import fake_target
original = vars(fake_target.Engine)["step"].__wrapped__
msprobe_hooks.deactivate()
assert vars(fake_target.Engine)["step"] is original
del sys.modules["fake_target"]
import fake_target
assert state()["depth"] == 0, "patched again without activation"
msprobe_hooks.activate()
"""
    result = run(code, env())
    assert result["depth"] == 1
    assert result["imports"] == 2


def test_a_raising_patch_leaves_the_target_importable_and_says_why_in_one_line():
    result = run_python(
        STATE + "import fake_target\nprint(json.dumps(state()))", env("fake_patches:RAISING,fake_patches:GOOD")
    )
    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["status"]["test.raising"] == ["failed", "RuntimeError: this patch is broken on purpose"]
    assert report["status"]["test.fake_engine"][0] == "applied"  # one failure does not stop the others
    lines = [line for line in result.stderr.splitlines() if "test.raising" in line]
    assert len(lines) == 1 and "broken on purpose" in lines[0]


def test_strict_mode_makes_a_raising_patch_fail_the_import():
    result = run_python("import fake_target", env("fake_patches:RAISING", MSPROBE_HOOKS_STRICT="1"))
    assert result.returncode == 1
    assert "RuntimeError: this patch is broken on purpose" in result.stderr


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ("TOO_NEW", "requires fake-target>=2, found 1.2.0"),
        ("DRIFTED", "target changed: fake_target:Engine.step(self, micro_batch, ...): parameters are (self, batch)"),
    ],
)
def test_an_unsupported_or_drifted_target_is_skipped_with_one_line(record, reason):
    result = run_python(STATE + "import fake_target\nprint(json.dumps(state()))", env(f"fake_patches:{record}"))
    assert result.returncode == 0, result.stderr
    name = {"TOO_NEW": "test.too_new", "DRIFTED": "test.drifted"}[record]
    state, why = result.json()["status"][name]
    assert state == "skipped" and why.startswith(reason)
    assert result.json()["depth"] == 0
    assert [line for line in result.stderr.splitlines() if name in line] == [
        line for line in result.stderr.splitlines() if "skipped patch" in line
    ]
    assert len(result.stderr.splitlines()) == 1


def test_strict_mode_refuses_a_drifted_target():
    result = run_python("import fake_target", env("fake_patches:DRIFTED", MSPROBE_HOOKS_STRICT="1"))
    assert result.returncode == 1 and "TargetChanged" in result.stderr


@pytest.mark.parametrize("value", ["test.fake_engine", "*", " test.fake_engine , "])
def test_disabled_patches_are_never_applied(value):
    result = run("import fake_target", env(MSPROBE_HOOKS_DISABLE=value))
    assert result["status"]["test.fake_engine"] == ["skipped", "disabled by MSPROBE_HOOKS_DISABLE"]
    assert result["depth"] == 0


def test_a_patch_applies_in_spawned_and_forked_children():
    code = """
import multiprocessing

def child(queue):
    import fake_target
    fake_target.Engine().step(1)
    queue.put(state())

if __name__ == "__main__":
    out = {}
    for method in ("spawn", "fork"):
        ctx = multiprocessing.get_context(method)
        queue = ctx.Queue()
        proc = ctx.Process(target=child, args=(queue,))
        proc.start()
        out[method] = queue.get(timeout=120)
        proc.join()
    print(json.dumps(out))
"""
    script = STATE + code
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write(script)
    result = run_python(f"import runpy; runpy.run_path({handle.name!r}, run_name='__main__')", env())
    assert result.returncode == 0, result.stderr
    for method, report in result.json().items():
        assert report["status"]["test.fake_engine"][0] == "applied", method
        assert (report["depth"], report["calls"]) == (1, 1), method


CONTEXT = """
import json
import fake_target, fake_patches_ctx, msprobe_hooks
from msprobe_hooks import patching
engine = fake_target.Engine()
results = [engine.step(1), engine.step(13), engine.step(13), fake_target.Engine.step(engine, batch=2)]
wrapped = [[owner.__name__, attribute] for owner, attribute in patching.wrapped_by("test.ctx_engine")]
msprobe_hooks.deactivate()
print(json.dumps({
    "results": results, "calls": fake_patches_ctx.CALLS, "seen": fake_patches_ctx.SEEN, "wrapped": wrapped,
    "after": list(patching.wrapped_by("test.ctx_engine")), "restored": type(vars(fake_target.Engine)["step"]).__name__,
}))
"""


def test_a_patch_with_a_context_wraps_through_its_ledger_and_its_guard_never_disturbs_the_call():
    result = run_python(CONTEXT, env("fake_patches:CTX"))
    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["results"] == [2, 26, 26, 4]  # the failing bookkeeping (batch 13) changed nothing
    assert report["calls"] == [1, 2]  # the argument read by keyword, self passed explicitly
    assert report["seen"] == {"name": "test.ctx_engine", "version": "1.2.0", "active": True}
    assert report["wrapped"] == [["Engine", "step"]]
    assert report["after"] == [] and report["restored"] == "function"  # reverted with no unpatch() of its own
    warnings = [line for line in result.stderr.splitlines() if " WARNING " in line]
    assert len(warnings) == 1  # the second failure at the same place goes to debug
    assert (
        "patch test.ctx_engine: counting a step failed, the host goes on unaffected: RuntimeError: unlucky batch"
        in (warnings[0])
    )


def test_strict_mode_raises_a_failure_inside_the_guard():
    code = "import fake_target\nfake_target.Engine().step(13)"
    result = run_python(code, env("fake_patches:CTX", MSPROBE_HOOKS_STRICT="1"))
    assert result.returncode == 1
    assert "RuntimeError: unlucky batch" in result.stderr


def test_a_patch_that_steps_aside_halfway_leaves_nothing_wrapped():
    code = """
import json, fake_target
from msprobe_hooks import patching
print(json.dumps({"status": [s.state for s in patching.status() if s.name == "test.half"],
                  "step": type(vars(fake_target.Engine)["step"]).__name__,
                  "wrapped": list(patching.wrapped_by("test.half"))}))
"""
    result = run_python(code, env("fake_patches:HALF"))
    assert result.returncode == 0, result.stderr
    assert result.json() == {"status": ["skipped"], "step": "function", "wrapped": []}
    assert "skipped patch test.half: Engine has no second method to wrap" in result.stderr
