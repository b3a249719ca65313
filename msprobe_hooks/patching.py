"""Applying patches lazily, guarded, idempotently and revertibly.

:func:`register` installs one post-import hook per patch (:mod:`.import_hooks`). When the target module is
imported (or at once, if it already was) :func:`_on_import` checks the installed version and
the patch's contract, then calls the implementation's ``patch(module, ctx)`` with a
:class:`PatchContext`. Every failure is contained there: one log line, the patch is marked skipped
or failed, and the target's import goes on, unless ``MSPROBE_HOOKS_STRICT=1``, which re-raises
(and so fails that import).

What a patch wraps goes through :meth:`PatchContext.wrap`, which records it in the patch's ledger:
:func:`unpatch_all` reverses the ledger, so an implementation has no ``unpatch`` of its own.
Wrappers are marked with the patch name, so applying twice never double-wraps, and
:func:`unwrap_method` restores exactly what :func:`wrap_method` replaced.

The module lock guards only the bookkeeping (states, ledgers): implementations are imported and
run without it, because they import modules and a lock held across an import deadlocks against
another thread's import. A patch is claimed under the lock before it runs, so
two threads never apply it twice.
"""

from __future__ import annotations

import _thread
import sys

from msprobe_hooks import contracts, storage
from msprobe_hooks.config import EVERY_PATCH
from msprobe_hooks.import_hooks import when_imported
from msprobe_hooks.log import logger
from msprobe_hooks.record import Record
from msprobe_hooks.registry import Patch

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: activation stays light
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from types import ModuleType
    from typing import Any, TypeGuard

    import wrapt

WAITING, APPLIED, SKIPPED, FAILED = "waiting", "applied", "skipped", "failed"
_MARK = "_self_msprobe_hooks_patch"


class TargetChanged(Exception):
    """The target no longer looks like what the patch was written for; the patch steps aside."""


class Refusal(RuntimeError):
    """A setup that cannot be dumped correctly, refused by decision with one line naming what to change.

    The only exception of ours meant to reach the host (each case is documented);
    :meth:`PatchContext.guarded` lets it through, every other failure of ours inside a wrapper it
    reports and contains.
    """


class _Application(Record):
    patch: Patch
    module: ModuleType
    ctx: PatchContext | None  # None: a site's old-style implementation, reverted by its own unpatch
    unpatch: Callable[[ModuleType], None] | None


class PatchStatus(Record):
    """One patch's state in this process (waiting, applied, skipped, failed) and why."""

    name: str
    state: str
    reason: str = ""
    version: str | None = None


_lock = _thread.RLock()  # _thread, not threading (which imports functools): activation stays light
_status: dict[str, PatchStatus] = {}
_applying: set[str] = set()  # claimed by a thread that runs the implementation outside the lock
_applied: dict[str, _Application] = {}
_ledger: dict[str, list[tuple[Any, str]]] = {}  # patch name -> (owner, attribute) it wrapped, in order
_generation = 0  # bumped by unpatch_all(): hooks registered before it become no-ops
_strict = False
_config: Any = None  # the activation Config register() was given: every PatchContext carries it
_failures_reported: set[tuple[str, str]] = set()
_MISSING = object()


class PatchContext:
    """What an implementation's ``patch(module, ctx)`` is handed: its record's name, the installed
    version (as the version gate read it), the activation config, and the framework's wrapping and
    guarding, bound to this patch."""

    def __init__(self, name: str, version: str | None, config: Any) -> None:
        self.name = name
        self.version = version
        self.config = config
        # False once unpatch_all() reverted this application: a wrapper still referenced from
        # elsewhere (a name imported before the revert) can then pass straight through.
        self.active = True

    def wrap(self, owner: type | ModuleType, attribute: str, wrapper: Callable[..., Any]) -> None:
        """:func:`wrap_method` under this patch's name, recorded in its ledger for :func:`unpatch_all`."""
        wrap_method(owner, attribute, wrapper, self.name)
        with _lock:
            ledger = _ledger.setdefault(self.name, [])
            if not any(o is owner and a == attribute for o, a in ledger):
                ledger.append((owner, attribute))

    def is_wrapped(self, owner: type | ModuleType, attribute: str) -> bool:
        """Whether ``owner.attribute`` is (still) this patch's wrapper."""
        return is_ours(vars(owner).get(attribute), self.name)

    def guarded(self, what: str, work: Callable[..., Any], *args: Any, default: Any = None) -> Any:
        """``work(*args)``, our own work inside a wrapper, never disturbing the host.

        A failure gives one warning per patch and ``what`` (later ones at debug level) and the
        caller gets ``default`` and goes on with the wrapped call unchanged; under
        ``MSPROBE_HOOKS_STRICT=1`` it is raised after its line. A :class:`Refusal` passes, as decided.
        """
        try:
            return work(*args)
        except Refusal:
            raise
        except Exception as exc:
            _report_failure(self.name, what, exc)
            return default


def _report_failure(patch_name: str, what: str, exc: BaseException) -> None:
    # Once per place, and once per failure: the same exception met at another place (a rejected config
    # in each kind of window) is the same news.
    keys = {(patch_name, what), (patch_name, f"{type(exc).__name__}: {exc}")}
    with _lock:
        first = not keys & _failures_reported
        _failures_reported.update(keys)
    path = storage.failed_path(exc)
    if path is not None:  # the storage under a dump root failed: one line per cause, naming it
        storage.report_loss(f"{what} ({patch_name})", exc, path, _strict)
        return
    import logging  # here: activation stays light

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


def argument(args: tuple, kwargs: dict, name: str, position: int, default: Any = _MISSING) -> Any:
    """A wrapped call's argument ``name``, passed by keyword or at ``position`` of ``args`` (as the
    wrapper receives them: after ``self`` when wrapt bound the instance), else ``default``."""
    if name in kwargs:
        return kwargs[name]
    if len(args) > position:
        return args[position]
    if default is _MISSING:
        raise TypeError(f"the wrapped call has no argument {name!r}")
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


def register(patches: Iterable[Patch], config: Any = None) -> None:
    """Install a post-import hook for every patch ``config`` (the activation ``Config``) does not disable.

    ``config`` is kept for the contexts the patches are applied with (``ctx.config``); its
    ``disabled`` names (``config.EVERY_PATCH``: all) are skipped, its ``strict`` holds for every failure.
    """
    global _strict, _config
    disabled = config.disabled if config is not None else frozenset()
    with _lock:
        _strict = bool(config is not None and config.strict)
        _config = config
        generation = _generation
        hooks = []
        for patch in patches:
            if patch.name in disabled or EVERY_PATCH in disabled:
                _status[patch.name] = PatchStatus(patch.name, SKIPPED, "disabled by MSPROBE_HOOKS_DISABLE")
                continue
            if _status.get(patch.name, PatchStatus("", "")).state in (WAITING, APPLIED):
                continue
            _status[patch.name] = PatchStatus(patch.name, WAITING, f"until {patch.target} is imported")
            hooks.append(patch)
    for patch in hooks:  # outside the lock: a target already imported is patched at once
        when_imported(patch.target, _hook(patch, generation))


def apply(patch: Patch, module: ModuleType, version: str | None = None, config: Any = None) -> PatchContext | None:
    """Run ``patch``'s implementation on ``module`` now, as the import hook does once its gates
    passed (tests and benchmarks drive a patch by hand through it); its context, or None for a
    site's old-style implementation (``patch(module)`` with its own ``unpatch(module)``).
    ``config`` is the context's (default: the one :func:`register` was given)."""
    import inspect  # here, as a target is patched: ~4 ms that activation need not pay
    from importlib import import_module

    implementation = import_module(patch.implementation)
    old_style = len(inspect.signature(implementation.patch).parameters) == 1
    ctx = None
    if old_style:
        implementation.patch(module)
    else:
        version = version if version is not None else installed_version(patch)
        ctx = PatchContext(patch.name, version, config if config is not None else _config)
        try:
            implementation.patch(module, ctx)
        except BaseException:  # a patch that is not applied leaves nothing wrapped
            _unwrap_ledger(patch.name)
            raise
    with _lock:
        _applied[patch.name] = _Application(patch, module, ctx, implementation.unpatch if old_style else None)
    return ctx


def _hook(patch: Patch, generation: int) -> Callable[[ModuleType], None]:
    """The post-import hook of ``patch`` (a closure: functools.partial would import functools at activation)."""
    return lambda module: _on_import(patch, generation, module)


def _on_import(patch: Patch, generation: int, module: ModuleType) -> None:
    log = logger()
    with _lock:  # claim the patch; the implementation runs after the lock is released
        if generation != _generation or patch.name in _applying:
            return
        if patch.name in _applied and _applied[patch.name].module is module:
            return
        _applying.add(patch.name)
    version = None
    try:
        version = installed_version(patch)
        problem = version_problem(patch, version)
        if problem:
            raise TargetChanged(problem)
        problems = contract_problems(patch, version)
        if problems:
            raise TargetChanged("target changed: " + "; ".join(problems))
        apply(patch, module, version)
        _set_status(PatchStatus(patch.name, APPLIED, "", version))
        log.info("applied patch %s to %s %s", patch.name, patch.distribution, version or "(version unknown)")
    except TargetChanged as exc:
        _set_status(PatchStatus(patch.name, SKIPPED, str(exc), version))
        log.warning("skipped patch %s: %s", patch.name, exc)
        if _strict:
            raise
    except Exception as exc:
        _set_status(PatchStatus(patch.name, FAILED, f"{type(exc).__name__}: {exc}", version))
        log.warning("patch %s failed and was not applied: %s: %s", patch.name, type(exc).__name__, exc)
        log.debug("patch %s failure", patch.name, exc_info=True)
        if _strict:
            raise
    finally:
        with _lock:
            _applying.discard(patch.name)


def _set_status(state: PatchStatus) -> None:
    with _lock:
        _status[state.name] = state


def strict() -> bool:
    """Whether MSPROBE_HOOKS_STRICT=1 is in effect: our own failures raise instead of stepping aside."""
    return _strict


def status() -> list[PatchStatus]:
    """Every patch this process knows of, with its state and the reason for it."""
    with _lock:
        return list(_status.values())


def wrapped_by(patch_name: str) -> tuple[tuple[Any, str], ...]:
    """(owner, attribute) of everything ``patch_name`` wraps now, in the order it wrapped them."""
    with _lock:
        ledger = list(_ledger.get(patch_name, ()))
    return tuple((owner, attribute) for owner, attribute in ledger if is_ours(vars(owner).get(attribute), patch_name))


def revert(patch_name: str) -> None:
    """Undo one applied patch: its ledger, newest first (or a site's own ``unpatch(module)``)."""
    with _lock:
        application = _applied.pop(patch_name, None)
    if application is not None and application.ctx is not None:
        application.ctx.active = False
    if application is not None and application.unpatch is not None:
        application.unpatch(application.module)
    _unwrap_ledger(patch_name)


def _unwrap_ledger(patch_name: str) -> None:
    with _lock:
        ledger = _ledger.pop(patch_name, [])
    for owner, attribute in reversed(ledger):
        unwrap_method(owner, attribute, patch_name)


def unpatch_all() -> None:
    """Revert every applied patch and forget pending hooks (tests; re-activate to patch again)."""
    global _generation, _config
    with _lock:
        names = list(_applied)
        _generation += 1
        _config = None
    for name in reversed(names):
        revert(name)
    with _lock:
        _status.clear()


def is_ours(obj: object, patch_name: str) -> TypeGuard[wrapt.FunctionWrapper[..., Any]]:
    wrapt = sys.modules.get("wrapt")  # nothing can be our wrapper before wrapt is imported
    return wrapt is not None and isinstance(obj, wrapt.FunctionWrapper) and getattr(obj, _MARK, None) == patch_name


def wrap_method(owner: type | ModuleType, name: str, wrapper: Callable[..., Any], patch_name: str) -> None:
    """Replace ``owner.name`` (defined on ``owner`` itself) with a wrapt FunctionWrapper, once.

    ``owner`` is a class (a method) or a module (a module-level function). A patch calls
    :meth:`PatchContext.wrap`; this is the primitive, kept for a site's old-style patch modules.
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
