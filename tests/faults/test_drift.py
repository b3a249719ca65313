"""Target drift, for every patch: a symbol missing, a parameter renamed, an extra parameter, an unsupported version.

The targets are stand-ins written by the test from each patch's own contract (a module per
contract module, a class or function per item, a ``dist-info`` naming the release) and put on
PYTHONPATH before the installed packages, so every patch meets the drifted target through the
real machinery: the shim activates, the test imports each target. Drifted: each patch's first
method or function item (dropped, its last parameter renamed, or a parameter inserted before its
last). Each patch must log one line and leave its target unpatched; then, in the same process,
re-activated under ``MSPROBE_HOOKS_STRICT=1``, every target's import must raise.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from support.interpreter import run_python, shim_env

from msprobe_hooks import contracts
from msprobe_hooks.contracts import Attribute, Function, Method
from msprobe_hooks.patches import PATCHES as CATALOGUE
from msprobe_hooks.patches import msprobe_writes
from msprobe_hooks.registry import Patch

from . import fault_matrix as fm

PATCHES: list[Patch] = [*CATALOGUE, msprobe_writes.PATCH]
RELEASES = json.loads((fm.REPO / "contracts" / "releases.json").read_text())
MSPROBE_RELEASE = "26.2.0"  # the one supported (debugger.MSPROBE_SUPPORTED); not in the release snapshot
# Top-level module of each distribution's stand-in, and the one release outside every supported range.
MODULES = {
    "verl": "verl",
    "sglang": "sglang",
    "vllm": "vllm",
    "vllm-ascend": "vllm_ascend",
    "mindstudio-probe": "msprobe",
}
UNSUPPORTED = "0.0.1"


def family(patch: Patch) -> str:
    """The matrix column of a patch."""
    name = patch.name
    if name == "verl.fsdp_engine":
        return fm.VERL_FSDP
    if name in ("verl.megatron_engine", "verl.legacy_actor", "verl.native_profiler_guard"):
        return fm.VERL_OTHER
    for prefix, column in (
        ("verl.trim_", fm.TRIM),
        ("verl.request_id_", fm.REQUEST_IDS),
        ("verl.preflight", fm.PREFLIGHT),
        ("sglang.", fm.SGLANG),
        ("vllm", fm.VLLM),
        ("msprobe.", fm.MSPROBE_WRITES),
    ):
        if name.startswith(prefix):
            return column
    raise AssertionError(f"no matrix column for patch {name}")


def release(patch: Patch) -> str:
    """The newest release of the snapshot that the patch supports (msprobe: its one supported release)."""
    if patch.distribution == "mindstudio-probe":
        return MSPROBE_RELEASE
    from packaging.version import Version

    versions = [v for v in RELEASES[patch.distribution] if contracts.version_supported(v, patch.versions)]
    return max(versions, key=Version)


def drifted_item(patch: Patch, version: str, kind: str) -> Method | Function | Attribute | None:
    """The item that ``kind`` drifts: the first method or function (for a missing symbol, else the first
    class an attribute is read from); None where the patch reads no parameters (nothing to rename)."""
    items = [i for i in patch.contract if contracts.applies(i, version)]
    callables = [i for i in items if isinstance(i, (Method, Function))]
    if callables:
        return callables[0]
    return items[0] if kind in ("symbol missing", "unsupported version") else None


def drifted(kind: str) -> list[Patch]:
    """The patches that ``kind`` can drift."""
    return [p for p in PATCHES if drifted_item(p, release(p), kind) is not None]


def drift(params: tuple[str, ...], kind: str) -> tuple[str, ...] | None:
    """The drifted parameter list (None: the symbol is gone)."""
    if kind == "symbol missing":
        return None
    if kind == "parameter renamed":
        return (*params[:-1], params[-1] + "_renamed")
    if kind == "extra parameter":
        return (*params[:-1], "inserted", params[-1])
    return params  # unsupported version: the target itself is as the patch expects


def write_site(site: Path, patches: list[Patch], kind: str) -> None:
    """Stand-in packages and dist-infos for ``patches``, each patch's first item drifted by ``kind``."""
    functions: dict[str, dict[str, tuple[str, ...] | None]] = {}
    classes: dict[str, dict[str, dict[str, tuple[str, ...] | None]]] = {}  # module -> class -> members
    dists: dict[str, str] = {}
    for patch in patches:
        version = release(patch)
        dists[patch.distribution] = UNSUPPORTED if kind == "unsupported version" else version
        drifted = drifted_item(patch, version, kind)
        for item in (i for i in patch.contract if contracts.applies(i, version)):
            if isinstance(item, Function):
                params = drift(item.params, kind) if item == drifted else item.params
                functions.setdefault(item.module, {}).setdefault(item.name, params)
                if item == drifted:
                    functions[item.module][item.name] = params
            elif isinstance(item, Method):
                owner, method = item.qualname.rsplit(".", 1)
                params = drift(item.params, kind) if item == drifted else item.params
                members = classes.setdefault(item.module, {}).setdefault(owner, {})
                if item == drifted or method not in members:
                    members[method] = params
            elif isinstance(item, Attribute) and not (item == drifted and kind == "symbol missing"):
                classes.setdefault(item.module, {}).setdefault(item.qualname, {})
        functions.setdefault(patch.target, {})
    modules = set(functions) | set(classes)
    parents = {name.rsplit(".", i)[0] for name in modules for i in range(1, name.count(".") + 1)}
    for name in sorted(modules | parents):
        lines = []
        for function, params in sorted(functions.get(name, {}).items()):
            if params is not None:
                lines.append(f"def {function}({', '.join(params)}): pass")
        for qualname, members in sorted(classes.get(name, {}).items()):
            lines += _class_source(qualname, members)
        folder = site / name.replace(".", "/")
        path = folder / "__init__.py" if name in parents else folder.with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)  # every parent package is written too, as its __init__.py
        path.write_text("\n".join(lines) + "\n")
    for dist, version in dists.items():
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        info.joinpath("top_level.txt").write_text(MODULES[dist] + "\n")


def _class_source(qualname: str, members: dict[str, tuple[str, ...] | None]) -> list[str]:
    """A class (nested classes of a dotted qualname included) with the given methods."""
    parts = qualname.split(".")
    lines = [f"{'    ' * depth}class {part}:" for depth, part in enumerate(parts)]
    indent = "    " * len(parts)
    lines.append(f"{indent}stand_in = True")
    for method, params in sorted(members.items()):
        if params is not None:
            lines.append(f"{indent}def {method}({', '.join(params)}): pass")
    return lines


CHILD = """
import importlib, json, os, sys
import msprobe_hooks
from msprobe_hooks import patching

targets = {targets!r}
for target in targets:
    importlib.import_module(target)
default = {{s.name: s.state for s in msprobe_hooks.status() if s.name in {names!r}}}
print("---- strict", file=sys.stderr, flush=True)
msprobe_hooks.deactivate()
for name in [m for m in sys.modules if m.split(".")[0] in {tops!r}]:
    del sys.modules[name]
os.environ["MSPROBE_HOOKS_STRICT"] = "1"
msprobe_hooks.activate()
raised = {{}}
for target in targets:
    try:
        importlib.import_module(target)
    except Exception as exc:
        raised[target] = type(exc).__name__
print(json.dumps({{"default": default, "raised": raised}}))
"""

KINDS = ["symbol missing", "parameter renamed", "extra parameter", "unsupported version"]


def groups(kind: str) -> list[list[Patch]]:
    """Patches that can share one process: one release per distribution."""
    if kind == "unsupported version":
        return [PATCHES]
    by_release: dict[tuple[str, str], list[Patch]] = {}
    for patch in drifted(kind):
        by_release.setdefault((patch.distribution, release(patch)), []).append(patch)
    verl = sorted((key for key in by_release if key[0] == "verl"), reverse=True)
    others = [p for key, ps in by_release.items() if key[0] != "verl" for p in ps]
    return [by_release[verl[0]] + others, *(by_release[key] for key in verl[1:])]


@pytest.mark.parametrize("kind", KINDS)
def test_a_drifted_target_is_skipped_with_one_line_and_raises_under_strict(kind, tmp_path):
    for n, patches in enumerate(groups(kind)):
        site = tmp_path / f"site{n}"
        write_site(site, patches, kind)
        names = [p.name for p in patches]
        targets = sorted({p.target for p in patches})
        tops = sorted({MODULES[p.distribution] for p in patches})
        code = textwrap.dedent(CHILD.format(targets=targets, names=names, tops=tops))
        env = shim_env(site, DUMP_ON="1", MSPROBE_HOOKS_OUTPUT_DIR=str(tmp_path / "out"))
        result = run_python(code, env)
        assert result.returncode == 0, result.stderr[-3000:]
        report = result.json()
        default_err, _, strict_err = result.stderr.partition("---- strict")
        for patch in patches:
            with fm.cell(f"target drift: {kind}", family(patch), strict=True) as tally:
                tally.runs += 1
                lines = fm.our_lines(default_err, f"patch {patch.name}:")
                assert len(lines) == 1, (patch.name, default_err[-3000:])
                expected = "requires" if kind == "unsupported version" else "target changed"
                assert expected in lines[0] and report["default"][patch.name] == "skipped", lines
                assert report["raised"].get(patch.target) == "TargetChanged", (patch.name, strict_err[-2000:])
        assert not (tmp_path / "out").exists()  # nothing written
