"""Check every patch's contract against the released source files of every supported version.

The patches for vLLM, vLLM-Ascend, SGLang and Megatron cannot run here, so what they rely on is
read from the real release files instead:

    python scripts/release_contracts.py refresh [DIST ...]  # read releases from PyPI, rewrite contracts/releases.json
    python scripts/release_contracts.py check               # offline: every contract against contracts/releases.json

``refresh`` lists every release of each patched distribution within the patches' supported
versions (final releases, plus the newest pre-release of a line that has no final release),
reads just the needed module files (HTTP range requests into wheels; whole sdists when there is
no wheel), and stores their *facts* (classes, methods and parameters, attributes; see
``msprobe_hooks.contracts``) with the file name and SHA-256 PyPI publishes. ``check`` needs no
network: the test suite runs it on every commit, and it fails on a drifted contract, and on a
snapshot that does not cover what the contracts now ask (run ``refresh``).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import sys
import tarfile
import urllib.request
import zipfile
from collections import defaultdict
from pathlib import Path
from urllib.parse import urljoin

from packaging.version import InvalidVersion, Version

from msprobe_hooks import contracts
from msprobe_hooks.patches import PATCHES
from msprobe_hooks.registry import Patch

SNAPSHOT = Path(__file__).resolve().parent.parent / "contracts" / "releases.json"
PYPI = "https://pypi.org/pypi/{dist}/json"
TIMEOUT = 120


# --- What the contracts ask -------------------------------------------------------------------


def distribution_of(module: str, patches: list[Patch]) -> str | None:
    """The distribution whose files hold ``module``: that of a patch targeting the same top package."""
    top = module.split(".")[0]
    return next((p.distribution for p in patches if p.target.split(".")[0] == top), None)


def asked_name(item: contracts.ContractItem) -> str:
    """What an item asks of its module: ``Class.member`` or a function name."""
    if isinstance(item, contracts.Function):
        return item.name
    return item.qualname if isinstance(item, contracts.Method) else f"{item.qualname}.{item.name}"


def wanted(patches: list[Patch]) -> dict[str, dict[str, set[str]]]:
    """{distribution: {module: {asked names}}} over every contract."""
    asked: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for patch in patches:
        for item in patch.contract:
            dist = distribution_of(item.module, patches) or patch.distribution
            asked[dist][item.module].add(asked_name(item))
    return asked


def module_facts(tree: ast.Module, names: set[str]) -> contracts.ModuleFacts:
    """The facts the asked names need: their classes (and same-module bases) with just the asked members."""
    classes = {name.rsplit(".", 1)[0] for name in names if "." in name}
    members = {name.rsplit(".", 1)[1] for name in names if "." in name}
    everything = contracts.extract_facts(tree)
    facts = contracts.extract_facts(tree, classes=classes)
    for cls in facts["classes"].values():  # members may live on a base class: keep them on every class
        cls["methods"] = {k: v for k, v in cls["methods"].items() if k in members}
        cls["attributes"] = [a for a in cls["attributes"] if a in members]
    facts["functions"] = {k: v for k, v in everything["functions"].items() if k in names}
    facts["requested"] = sorted(names)
    return facts


def supported_versions(released: list[str], specs: list[str]) -> list[str]:
    """Released versions any spec admits: finals, and the newest pre-release of a line with no final."""
    parsed = []
    for raw in released:
        try:
            parsed.append(Version(raw))
        except InvalidVersion:
            continue
    finals = {v.release for v in parsed if not v.is_prerelease and not v.is_devrelease}
    newest_pre: dict[tuple[int, ...], Version] = {}
    for v in parsed:
        if (v.is_prerelease or v.is_devrelease) and v.release not in finals:
            newest_pre[v.release] = max(v, newest_pre.get(v.release, v))
    candidates = [v for v in parsed if not (v.is_prerelease or v.is_devrelease)] + list(newest_pre.values())
    chosen = [v for v in candidates if any(contracts.version_supported(str(v), spec) for spec in specs)]
    return [str(v) for v in sorted(chosen)]


# --- Reading release files --------------------------------------------------------------------


class RangeFile(io.RawIOBase):
    """A seekable read-only view of a remote file through HTTP range requests (enough for zipfile)."""

    def __init__(self, url: str) -> None:
        self.url = url
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=TIMEOUT) as response:
            self.size = int(response.headers["Content-Length"])
        self.pos = 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if self.pos >= self.size or len(buffer) == 0:
            return 0
        end = min(self.size, self.pos + len(buffer)) - 1
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end}"})
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            data = response.read()
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def read_members(url: str, filename: str, relpaths: set[str]) -> dict[str, str]:
    """{relpath: source} for the wanted module files found in a wheel or an sdist."""
    found: dict[str, str] = {}
    if filename.endswith(".whl"):
        with zipfile.ZipFile(io.BufferedReader(RangeFile(url), buffer_size=1 << 16)) as wheel:
            names = set(wheel.namelist())
            for rel in relpaths & names:
                found[rel] = wheel.read(rel).decode("utf-8")
        return found
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response, tarfile.open(fileobj=response, mode="r|gz") as sdist:
        for member in sdist:
            # sdists hold "<name>-<version>/<relpath>"
            rel = member.name.split("/", 1)[1] if "/" in member.name else ""
            if rel in relpaths and member.isfile():
                found[rel] = sdist.extractfile(member).read().decode("utf-8")  # type: ignore[union-attr]
    return found


def pick_file(files: list[dict]) -> dict | None:
    """A wheel (x86_64 or pure Python first), else the sdist."""
    usable = [f for f in files if not f.get("yanked")]

    def rank(f: dict) -> int:
        name = f["filename"]
        if name.endswith(".whl"):
            return 0 if ("none-any" in name or "x86_64" in name) else 1
        return 2 if name.endswith(".tar.gz") else 9

    usable.sort(key=rank)
    return usable[0] if usable and rank(usable[0]) < 9 else None


def release_record(dist: str, version: str, files: list[dict], asked: dict[str, set[str]]) -> dict:
    chosen = pick_file(files)
    if chosen is None:
        raise RuntimeError(f"{dist} {version}: no wheel or sdist on PyPI")
    url = urljoin(PYPI.format(dist=dist), chosen["url"])
    relpaths = {rel for module in asked for rel in contracts.module_relpaths(module)}
    sources = read_members(url, chosen["filename"], relpaths)
    modules = {}
    for module, names in sorted(asked.items()):
        source = next((sources[rel] for rel in contracts.module_relpaths(module) if rel in sources), None)
        if source is None:
            modules[module] = None
            continue
        modules[module] = module_facts(ast.parse(source), names)
    return {"file": chosen["filename"], "sha256": chosen["digests"]["sha256"], "modules": modules}


def refresh(dists: list[str]) -> int:
    patches = list(PATCHES)
    asked_all = wanted(patches)
    snapshot = json.loads(SNAPSHOT.read_text()) if SNAPSHOT.exists() else {}
    for dist in dists or sorted(asked_all):
        specs = [p.versions for p in patches if p.distribution == dist]
        with urllib.request.urlopen(PYPI.format(dist=dist), timeout=TIMEOUT) as response:
            releases = json.load(response)["releases"]
        versions = supported_versions(list(releases), specs)
        snapshot[dist] = {}
        for version in versions:
            print(f"{dist} {version} ...", flush=True)
            snapshot[dist][version] = release_record(dist, version, releases[version], asked_all[dist])
    SNAPSHOT.parent.mkdir(exist_ok=True)
    SNAPSHOT.write_text(json.dumps(snapshot, indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
    return 0


# --- Checking ---------------------------------------------------------------------------------


def problems(patches: list[Patch], snapshot: dict) -> dict[str, dict[str, list[str]]]:
    """{patch name: {version: [problem, ...]}} for every supported version in the snapshot."""
    found: dict[str, dict[str, list[str]]] = {}
    for patch in patches:
        releases = snapshot.get(patch.distribution, {})
        versions = [v for v in releases if contracts.version_supported(v, patch.versions)]
        if not versions:
            found[patch.name] = {"-": [f"no release of {patch.distribution}{patch.versions} in the snapshot"]}
            continue
        for version in sorted(versions, key=Version):
            lines = []
            for item in patch.contract:
                if distribution_of(item.module, patches) not in (None, patch.distribution):
                    lines.append(f"{item.describe()}: belongs to another distribution than {patch.distribution}")
                    continue
                if not contracts.applies(item, version):
                    continue
                facts = releases[version]["modules"].get(item.module, "absent")
                if facts == "absent" or (facts is not None and asked_name(item) not in facts["requested"]):
                    lines.append(f"{item.describe()}: not in the snapshot (run: scripts/release_contracts.py refresh)")
                    continue
                problem = contracts.check_facts(item, facts)
                if problem:
                    lines.append(problem)
            found.setdefault(patch.name, {})[version] = lines
    return found


def check() -> int:
    snapshot = json.loads(SNAPSHOT.read_text())
    report = problems(list(PATCHES), snapshot)
    failed = False
    for name, per_version in report.items():
        bad = {v: lines for v, lines in per_version.items() if lines}
        failed = failed or bool(bad)
        print(f"{name}: {len(per_version) - len(bad)}/{len(per_version)} releases satisfy the contract")
        for version, lines in bad.items():
            for line in lines:
                print(f"  {version}: {line}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    refresh_parser = sub.add_parser("refresh", help="read release files from PyPI and rewrite the snapshot")
    refresh_parser.add_argument("dists", nargs="*", help="only these distributions (default: all patched ones)")
    sub.add_parser("check", help="check every contract against the snapshot (offline)")
    args = parser.parse_args(argv)
    return refresh(args.dists) if args.cmd == "refresh" else check()


if __name__ == "__main__":
    sys.exit(main())
