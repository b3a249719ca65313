"""A reusable patch test case, in the manner of ddtrace's ``PatchTestCase``: every ordering of
importing, patching and unpatching a target, each in a fresh interpreter.

:class:`PatchTestCase` holds the test methods; a test module subclasses it and provides a
``case`` fixture (a :class:`Case`: one patch at one :class:`Site`) and a ``runs`` fixture (a
:class:`Runs`). Each test method asserts on one ordering's trace, run by ``patch_case_child.py``
once per site and ordering, for all the site's patches together (as a process registers them all):

* ``import, patch, patch``: a target imported before activation is patched at once, and a second
  registration wraps nothing twice;
* ``patch, patch, import``: activation imports no target; the import applies the patch, once;
* ``import, patch, unpatch, import, patch``: unpatching restores every attribute to the very
  object it was, a re-import stays unpatched, patching again wraps once;
* ``patch, unpatch, import``: hooks registered before an unpatch do nothing at a later import.

"Wrapped" is read from the target module itself: its functions and its classes' attributes that
hold a wrapper of that patch (``patching.is_ours``). What a patch must do at a site follows from its
record: a version outside ``Patch.versions`` is skipped and wraps nothing; a supported version is
applied and wraps something, except where :data:`WRAPS_NOTHING` says the patch has nothing to do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from msprobe_hooks import contracts
from msprobe_hooks.patches import PATCHES
from msprobe_hooks.patching import APPLIED, SKIPPED, WAITING
from msprobe_hooks.registry import Patch
from support import REPO, STANDINS
from support.interpreter import clean_env
from support.sglang_standin import FAMILIES as SGLANG_STANDINS
from support.vllm_standin import SITE as VLLM_STANDINS
from support.vllm_standin import standin_site

CHILD = Path(__file__).resolve().parent / "patch_case_child.py"

IMPORT_PATCH_PATCH = ("import", "patch", "patch")
PATCH_PATCH_IMPORT = ("patch", "patch", "import")
IMPORT_PATCH_UNPATCH_IMPORT_PATCH = ("import", "patch", "unpatch", "import", "patch")
PATCH_UNPATCH_IMPORT = ("patch", "unpatch", "import")

# Patches that apply and have nothing to wrap at some supported versions: patch name -> (versions, why).
WRAPS_NOTHING = {
    "sglang.schedule_batch": (">=0.5.6", "from 0.5.6 ModelWorkerBatch carries its requests itself"),
}


@dataclass(frozen=True)
class Site:
    """Where a fresh interpreter finds patch targets: this venv's real packages, or stand-ins.

    A real site covers every patch of its distributions, a target it lacks included (that patch
    must then wait, harmlessly); a stand-in site covers only the targets it has a stand-in for.
    """

    name: str
    versions: Mapping[str, str]  # distribution -> the version the site installs
    roots: Sequence[Path]  # where the site's module files are
    folders: Callable[[Path], Sequence[Path]] = lambda root: ()  # ahead of site-packages, made under root
    prelude: str = ""  # run before the targets are imported
    real: bool = False

    def has(self, target: str) -> bool:
        places = contracts.module_relpaths(target)
        return any((root / rel).is_file() for root in self.roots for rel in places)

    def provides(self, patch: Patch) -> bool:
        return patch.distribution in self.versions and (self.real or self.has(patch.target))


def _sglang_site(version: str, folder: Path) -> Site:
    return Site(f"sglang-{version}-standin", {"sglang": version}, (folder,), lambda root: (folder, STANDINS))


def _vllm_site(vllm: str, vllm_ascend: str) -> Site:
    def folders(root: Path) -> tuple[Path, Path]:
        return standin_site(root, vllm, vllm_ascend), VLLM_STANDINS

    return Site(f"vllm-{vllm}-standin", {"vllm": vllm, "vllm-ascend": vllm_ascend}, (VLLM_STANDINS,), folders)


# verl runs for real (its CPU platform registered first, as on a CPU it must be), its Megatron engine
# module included: megatron-core and mbridge are installed beside it (make install-megatron).
VERL_PRELUDE = """
from cpu_kit import verl_cpu
verl_cpu.register_cpu_platform()
"""
SITES = (
    Site(
        "verl-real",
        {"verl": metadata.version("verl")},
        (Path(metadata.distribution("verl").locate_file("")),),
        prelude=VERL_PRELUDE,
        real=True,
    ),
    _vllm_site("0.23.0", "0.23.0"),
    _vllm_site("0.11.1", "0.11.0"),  # before Model Runner V2 and before the vLLM-Ascend releases we support
    *(_sglang_site(version, folder) for version, folder in SGLANG_STANDINS.items()),
)


@dataclass(frozen=True)
class Case:
    patch: Patch
    site: Site

    def __str__(self) -> str:
        return f"{self.patch.name}@{self.site.name}"

    @property
    def version(self) -> str:
        return self.site.versions[self.patch.distribution]

    @property
    def absent(self) -> bool:
        """The site lacks the target (a real site, a release without that module): the patch waits forever."""
        return not self.site.has(self.patch.target)

    @property
    def skipped(self) -> bool:
        """The site's version is outside the record's: the patch steps aside."""
        return not contracts.version_supported(self.version, self.patch.versions)

    @property
    def wraps_nothing(self) -> str | None:
        """Why the patch, applied at this version, has nothing to wrap (None: it must wrap something)."""
        gate = WRAPS_NOTHING.get(self.patch.name)
        return gate[1] if gate and contracts.version_supported(self.version, gate[0]) else None


def cases(patches: Sequence[Patch], sites: Sequence[Site] = SITES) -> list[Case]:
    """Every patch at every site that provides its target."""
    return [Case(patch, site) for patch in patches for site in sites if site.provides(patch)]


def builtin_cases() -> list[Case]:
    return cases(PATCHES)


class Runs:
    """The traces of each site and ordering, each run once (a fresh interpreter) when first asked for."""

    def __init__(self, root: Path, patches: Sequence[Patch]) -> None:
        self.root = root
        self.patches = patches
        self._traces: dict[tuple[str, tuple[str, ...]], list[dict]] = {}

    def trace(self, site: Site, steps: tuple[str, ...]) -> list[dict]:
        key = (site.name, steps)
        if key not in self._traces:
            self._traces[key] = self._run(site, steps)
        return self._traces[key]

    def _run(self, site: Site, steps: tuple[str, ...]) -> list[dict]:
        work = self.root / site.name / "-".join(steps)
        work.mkdir(parents=True)
        spec = {
            "prelude": site.prelude,
            "targets": {p.name: p.target for p in self.patches if site.provides(p)},
            "imports": [p.target for p in self.patches if site.provides(p) and site.has(p.target)],
            "steps": list(steps),
            "environ": {"DUMP_ON": "1", "MSPROBE_HOOKS_OUTPUT_DIR": str(work / "out")},
        }
        path = [*site.folders(self.root), REPO, REPO / "tests"]
        env = clean_env(PYTHONPATH=os.pathsep.join(map(str, path)), TORCHDYNAMO_DISABLE="1")
        command = [sys.executable, str(CHILD), json.dumps(spec)]
        done = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{site.name} {steps}: exit {done.returncode}\n{done.stderr[-4000:]}"
        return json.loads(done.stdout.splitlines()[-1])


class PatchTestCase:
    """The ddtrace-style orderings, asserted for one patch (the ``case`` fixture) at one site."""

    @staticmethod
    def _steps(runs: Runs, case: Case, steps: tuple[str, ...]) -> list[dict]:
        """Per step of that ordering: what it left of this patch, and whether its target was imported."""
        trace = runs.trace(case.site, steps)
        return [{**step["patches"][case.patch.name], "imported": step["imported"][case.patch.target]} for step in trace]

    @staticmethod
    def assert_patched(case: Case, seen: dict) -> None:
        """What the record says of the site's version: skipped; applied, nothing to wrap; applied, wrapping once.
        Without the target: still waiting, nothing imported."""
        if case.absent:
            assert (seen["state"], seen["wrapped"], seen["imported"]) == (WAITING, [], False), seen
            return
        if case.skipped:
            assert (seen["state"], seen["wrapped"]) == (SKIPPED, []), seen
            assert seen["reason"].startswith(f"requires {case.patch.distribution}"), seen
            return
        assert seen["state"] == APPLIED, seen
        if case.wraps_nothing:
            assert seen["wrapped"] == [], f"{case}: {case.wraps_nothing}, yet it wrapped {seen['wrapped']}"
        else:
            assert seen["wrapped"], f"{case}: applied, yet nothing in {case.patch.target} holds its wrapper"
        assert seen["double"] == [], seen

    @staticmethod
    def assert_not_patched(seen: dict) -> None:
        assert (seen["state"], seen["wrapped"], seen["changed"]) == (None, [], []), seen

    def test_import_patch_patch(self, runs: Runs, case: Case) -> None:
        imported, patched, again = self._steps(runs, case, IMPORT_PATCH_PATCH)
        assert imported["imported"] != case.absent
        self.assert_not_patched(imported)
        self.assert_patched(case, patched)
        self.assert_patched(case, again)
        assert again["wrapped"] == patched["wrapped"]

    def test_patch_patch_import(self, runs: Runs, case: Case) -> None:
        patched, again, imported = self._steps(runs, case, PATCH_PATCH_IMPORT)
        for waiting in (patched, again):
            assert not waiting["imported"], "activation imported the target"
            assert (waiting["state"], waiting["wrapped"]) == (WAITING, []), waiting
        self.assert_patched(case, imported)

    def test_import_patch_unpatch_import_patch(self, runs: Runs, case: Case) -> None:
        _, patched, unpatched, reimported, repatched = self._steps(runs, case, IMPORT_PATCH_UNPATCH_IMPORT_PATCH)
        self.assert_not_patched(unpatched)
        self.assert_not_patched(reimported)
        self.assert_patched(case, repatched)
        assert repatched["wrapped"] == patched["wrapped"]

    def test_patch_unpatch_import(self, runs: Runs, case: Case) -> None:
        *_, imported = self._steps(runs, case, PATCH_UNPATCH_IMPORT)
        assert imported["imported"] != case.absent
        self.assert_not_patched(imported)
