"""Applying patches lazily, guarded, idempotently and revertibly.

:func:`register` installs one post-import hook per patch (:mod:`.import_hooks`). When the target module is
imported (or at once, if it already was) :func:`_on_import` checks the installed version and
the patch's contract, then calls the implementation's ``patch(module)``. Every failure is
contained there: one log line, the patch is marked skipped or failed, and the target's import
goes on, unless ``MSPROBE_HOOKS_STRICT=1``, which re-raises (and so fails that import).

Wrappers are marked with the patch name, so applying twice never double-wraps, and
:func:`unwrap_method` restores exactly what :func:`wrap_method` replaced.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, NamedTuple

from msprobe_hooks import contracts
from msprobe_hooks.import_hooks import when_imported
from msprobe_hooks.log import logger
from msprobe_hooks.registry import Patch

WAITING, APPLIED, SKIPPED, FAILED = "waiting", "applied", "skipped", "failed"
_MARK = "_self_msprobe_hooks_patch"


class TargetChanged(Exception):
    """The target no longer looks like what the patch was written for; the patch steps aside."""


class Refusal(RuntimeError):
    """A setup that cannot be dumped correctly, refused by decision with one line naming what to change.

    The only exception of ours meant to reach the host (each case is documented); :func:`guarded`
    lets it through, every other failure of ours inside a wrapper it reports and contains.
    """


class PatchStatus(NamedTuple):
    name: str
    state: str
    reason: str = ""
    version: str | None = None


_lock = threading.RLock()
_status: dict[str, PatchStatus] = {}
_applied: dict[str, tuple[Patch, ModuleType]] = {}
_generation = 0  # bumped by unpatch_all(): hooks registered before it become no-ops
_strict = False
_failures_reported: set[tuple[str, str]] = set()


def installed_version(patch: Patch) -> str | None:
    """The version of the distribution providing the target, else its imported top package's ``__version__``."""
    version = contracts.module_version(patch.target)
    if version is None:
        version = getattr(sys.modules.get(patch.target.split(".")[0]), "__version__", None)
    return str(version) if version else None


def version_problem(patch: Patch, version: str | None) -> str | None:
    if version is None or contracts.version_supported(version, patch.versions):
        return None
    return f"requires {patch.distribution}{patch.versions}, found {version}"


def contract_problems(patch: Patch, version: str | None) -> list[str]:
    return [
        problem
        for item in patch.contract
        if contracts.applies(item, version) and (problem := contracts.check_installed(item))
    ]


def register(patches: Iterable[Patch], disabled: frozenset[str] = frozenset(), strict: bool = False) -> None:
    """Install a post-import hook for every patch not disabled (``*`` disables all)."""
    global _strict
    with _lock:
        _strict = strict
        generation = _generation
        for patch in patches:
            if patch.name in disabled or "*" in disabled:
                _status[patch.name] = PatchStatus(patch.name, SKIPPED, "disabled by MSPROBE_HOOKS_DISABLE")
                continue
            if _status.get(patch.name, PatchStatus("", "")).state in (WAITING, APPLIED):
                continue
            _status[patch.name] = PatchStatus(patch.name, WAITING, f"until {patch.target} is imported")
            when_imported(patch.target, functools.partial(_on_import, patch, generation))


def _on_import(patch: Patch, generation: int, module: ModuleType) -> None:
    if generation != _generation:
        return
    log = logger()
    version = None
    try:
        with _lock:
            if patch.name in _applied and _applied[patch.name][1] is module:
                return
            version = installed_version(patch)
            problem = version_problem(patch, version)
            if problem:
                raise TargetChanged(problem)
            problems = contract_problems(patch, version)
            if problems:
                raise TargetChanged("target changed: " + "; ".join(problems))
            importlib.import_module(patch.implementation).patch(module)
            _applied[patch.name] = (patch, module)
            _status[patch.name] = PatchStatus(patch.name, APPLIED, "", version)
        log.info("applied patch %s to %s %s", patch.name, patch.distribution, version or "(version unknown)")
    except TargetChanged as exc:
        _status[patch.name] = PatchStatus(patch.name, SKIPPED, str(exc), version)
        log.warning("skipped patch %s: %s", patch.name, exc)
        if _strict:
            raise
    except Exception as exc:
        _status[patch.name] = PatchStatus(patch.name, FAILED, f"{type(exc).__name__}: {exc}", version)
        log.warning("patch %s failed and was not applied: %s: %s", patch.name, type(exc).__name__, exc)
        log.debug("patch %s failure", patch.name, exc_info=True)
        if _strict:
            raise


def status() -> list[PatchStatus]:
    """Every patch this process knows of, with its state and the reason for it."""
    with _lock:
        return list(_status.values())


def unpatch_all() -> None:
    """Revert every applied patch and forget pending hooks (tests; re-activate to patch again)."""
    global _generation
    with _lock:
        for patch, module in reversed(list(_applied.values())):
            importlib.import_module(patch.implementation).unpatch(module)
        _applied.clear()
        _status.clear()
        _generation += 1


def report_failure(patch_name: str, what: str, exc: BaseException) -> None:
    """Our own work inside a wrapper failed: one warning per patch and place, later ones at debug level.

    The caller goes on with the wrapped call unchanged; a failing hook must not flood the host's log.
    Under ``MSPROBE_HOOKS_STRICT=1`` ``exc`` is raised instead, after its line (CI, development).
    """
    import logging

    key = (patch_name, what)
    with _lock:
        first = key not in _failures_reported
        _failures_reported.add(key)
    log = logger()
    log.log(
        logging.WARNING if first else logging.DEBUG,
        "patch %s: %s failed, the host goes on unaffected: %s: %s",
        patch_name,
        what,
        type(exc).__name__,
        exc,
        exc_info=log.isEnabledFor(logging.DEBUG),
    )
    if _strict:
        raise exc


def guarded(patch_name: str, what: str, work: Callable[..., Any], *args: Any, default: Any = None) -> Any:
    """``work(*args)``, our own work inside a wrapper: a failure is reported (:func:`report_failure`)
    and the caller gets ``default`` and goes on with the wrapped call unchanged; a :class:`Refusal`
    passes, as decided."""
    try:
        return work(*args)
    except Refusal:
        raise
    except Exception as exc:
        report_failure(patch_name, what, exc)
        return default


def bound(instance: Any, args: tuple) -> tuple[Any, tuple]:
    """A wrapped method's ``self`` and its other arguments.

    wrapt binds no instance when the method is called through its class with ``self`` passed
    explicitly (``Engine.method(engine, data)``, as tests with a stand-in ``self`` do): ``self``
    is then ``args[0]``. The wrapped call itself still takes ``args`` as they came.
    """
    if instance is None and args:
        return args[0], args[1:]
    return instance, args


def is_ours(obj: Any, patch_name: str) -> bool:
    wrapt = sys.modules.get("wrapt")  # nothing can be our wrapper before wrapt is imported
    return wrapt is not None and isinstance(obj, wrapt.FunctionWrapper) and getattr(obj, _MARK, None) == patch_name


def wrap_method(owner: type | ModuleType, name: str, wrapper: Callable[..., Any], patch_name: str) -> None:
    """Replace ``owner.name`` (defined on ``owner`` itself) with a wrapt FunctionWrapper, once.

    ``owner`` is a class (a method) or a module (a module-level function).
    """
    current = vars(owner).get(name)
    if current is None:
        where = getattr(owner, "__qualname__", owner.__name__)
        raise TargetChanged(f"{where}.{name} is not defined on {where}")
    if is_ours(current, patch_name):
        return
    import wrapt

    proxy = wrapt.FunctionWrapper(current, wrapper)
    setattr(proxy, _MARK, patch_name)
    setattr(owner, name, proxy)


def unwrap_method(owner: type | ModuleType, name: str, patch_name: str) -> None:
    """Undo :func:`wrap_method`; a no-op when our wrapper is not (or no longer) there."""
    current = vars(owner).get(name)
    if is_ours(current, patch_name):
        setattr(owner, name, current.__wrapped__)
