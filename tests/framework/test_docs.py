"""The generated reference pages match the code they are generated from."""

from __future__ import annotations

import importlib.util
import re

from support import REPO

from msprobe_hooks.patches import PATCHES


def test_generated_docs_are_current():
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    gen_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_docs)
    assert gen_docs.stale_pages() == [], "stale generated docs: run python scripts/gen_docs.py"


# A file of this repository named in prose (tests/..., cpu_kit/..., examples/...), a glob allowed.
_ROOTS = "tests|cpu_kit|examples|benchmarks|scripts"
_NAMED_FILE = re.compile(rf"(?<![\w/.-])((?:{_ROOTS})/[\w/*.-]*[\w*]\.(?:py|md|sh|json))")


def _named_files(text: str) -> set[str]:
    return set(_NAMED_FILE.findall(text))


def test_every_file_the_docs_and_records_name_exists() -> None:
    """Moving a test or a helper must not leave a page, the Makefile or a Patch record naming its old place."""
    sources = {path.relative_to(REPO).as_posix(): path.read_text() for path in (REPO / "docs").glob("*.md")}
    for name in ("README.md", "Makefile", ".ci/run", "tests/standins/README.md"):
        sources[name] = (REPO / name).read_text()
    sources["Patch.ran_for_real"] = "\n".join(line for patch in PATCHES for line in patch.ran_for_real)
    missing = {
        f"{source}: {named}"
        for source, text in sources.items()
        for named in _named_files(text)
        if not any(REPO.glob(named))
    }
    assert not missing, sorted(missing)
    assert _named_files(sources["Patch.ran_for_real"]), "the records name the tests that ran them for real"


_CONFLICT_MARKER = re.compile(r"^(<{7} |={7}$|>{7} )", re.MULTILINE)


def test_no_tracked_file_holds_a_merge_conflict_marker() -> None:
    """A merge resolved by hand once left both sides of a hunk in a page and a docstring, markers and all."""
    suffixes = (".py", ".md", ".sh", ".toml", ".cfg", ".txt", ".json")
    ours = [REPO / name for name in ("Makefile", ".ci/run", "pyproject.toml", "README.md")]
    for root in ("msprobe_hooks", "cpu_kit", "tests", "docs", "examples", "scripts", "benchmarks", "contracts"):
        ours += [path for path in (REPO / root).rglob("*") if path.suffix in suffixes and "golden" not in path.parts]
    marked = [str(path.relative_to(REPO)) for path in ours if _CONFLICT_MARKER.search(path.read_text(errors="replace"))]
    assert not marked, marked
    assert _CONFLICT_MARKER.search("a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> ppo\n")
