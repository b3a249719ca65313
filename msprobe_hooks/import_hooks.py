"""Post-import hooks: call a function once a named module has been imported.

The semantics are wrapt's ``register_post_import_hook``: a hook runs once, right after its module
finishes executing, or at once if the module is already imported. The finder is ours rather than
``wrapt.importer`` because importing wrapt 2.x pulls in asyncio and importlib.metadata, about
35 ms at every interpreter start-up, while activation must stay cheap in every process of a job.
wrapt itself is imported only when a patch is applied, that is, once a (heavy) target is imported.
"""

from __future__ import annotations

import _thread
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: activation stays light
if TYPE_CHECKING:
    from collections.abc import Callable
    from importlib.abc import Loader
    from types import ModuleType
    from typing import Any

    Hook = Callable[[ModuleType], None]


_lock = _thread.RLock()  # _thread, not threading (which imports functools): activation stays light
_hooks: dict[str, list[Hook]] = {}
_finder: _HookFinder | None = None


def when_imported(name: str, hook: Hook) -> None:
    """Run ``hook(module)`` once ``name`` is imported; at once when it already is."""
    global _finder
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _hooks.setdefault(name, []).append(hook)
            if _finder is None:
                _finder = _HookFinder()
                sys.meta_path.insert(0, _finder)
    if module is not None:
        hook(module)  # outside the lock: the hook may import and so re-enter


def _notify(module: ModuleType) -> None:
    with _lock:
        hooks = _hooks.pop(module.__name__, ())
    for hook in hooks:
        hook(module)


class _ChainedLoader:
    """Runs the real loader, then the module's hooks; the module keeps its real loader."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _notify(sys.modules.get(module.__name__, module))


class _HookFinder:  # duck-typed: importlib.abc alone costs ~8 ms to import
    def __init__(self) -> None:
        self._busy = _thread._local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _hooks or getattr(self._busy, fullname, False):
            return None
        setattr(self._busy, fullname, True)  # a finder below may re-enter the import system
        spec = None
        try:
            for finder in sys.meta_path:  # the finders after us, in their order
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            setattr(self._busy, fullname, False)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        from typing import cast  # here: only a hooked module's import gets this far

        # duck-typed, not an importlib.abc.Loader: that module alone costs ~8 ms to import
        spec.loader = cast("Loader", _ChainedLoader(spec.loader))
        return spec
