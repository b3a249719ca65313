"""msprobe-hooks activation shim: the only file that goes on PYTHONPATH.

Python imports the first ``sitecustomize`` on ``sys.path`` at start-up. This one

1. returns at once when DUMP_ON is unset or false, having imported nothing but ``os`` and ``sys``;
2. otherwise activates the *installed* ``msprobe_hooks`` package (silently does nothing when this
   interpreter cannot import it); a bad configuration stops the process with exit status 2;
3. always chains the ``sitecustomize`` it shadows, so a user's or distribution's one still runs,
   exactly once.

Nothing here may raise into the interpreter: every failure is reported on one stderr line.
Standard library only; keep it that way (it runs in every Python process of the job).
"""

import os
import sys

_OFF = ("", "0", "false", "no", "off")


def _report(what, exc):
    sys.stderr.write(f"[msprobe-hooks {os.getpid()}] ERROR {what}: {type(exc).__name__}: {exc}\n")


def _activate():
    if os.environ.get("DUMP_ON", "").strip().lower() in _OFF:
        return
    try:
        from msprobe_hooks import bootstrap
    except ModuleNotFoundError as exc:
        if exc.name == "msprobe_hooks":
            return  # not installed for this interpreter (a stray system Python inheriting the env)
        raise
    bootstrap.activate_from_shim()


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    ours = [i for i, entry in enumerate(sys.path) if os.path.abspath(entry or os.curdir) == here]
    if not ours:
        return
    me = sys.modules.pop("sitecustomize")  # this module: Python's site imported it under that name
    sys.modules["msprobe_hooks_shim"] = me
    for i in reversed(ours):
        del sys.path[i]
    try:
        import sitecustomize  # noqa: F401  (the next one on sys.path, if any)
    except ImportError as exc:
        sys.modules["sitecustomize"] = me
        if exc.name != "sitecustomize":
            _report("the sitecustomize this shim chains failed", exc)
    except Exception as exc:
        sys.modules["sitecustomize"] = me
        _report("the sitecustomize this shim chains failed", exc)
    finally:
        sys.path.insert(ours[0], here)


try:
    _activate()
except Exception as exc:
    _report("msprobe-hooks activation failed, continuing without it", exc)
try:
    _chain()
except Exception as exc:
    _report("chaining sitecustomize failed", exc)
