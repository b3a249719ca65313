"""Running the SGLang stand-ins in fresh interpreters, and reading what they leave behind."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

from msprobe_hooks import contracts
from support import STANDINS
from support.interpreter import Result, run_python, shim_env

FAMILIES = {
    "0.5.2": STANDINS / "sglang_0_5_2",
    "0.5.10": STANDINS / "sglang_0_5_10",
    "0.5.11": STANDINS / "sglang_0_5_11",
    "0.5.23": STANDINS / "sglang_0_5_23",
}
# The bases and pieces every version's stand-in shares (see its docstring).
COMMON = STANDINS / "sglang_common.py"

# Two prompts, then a third that shares the first one's first three tokens (a radix-cache hit).
WAVES = [{"req-a": [1, 2, 3, 4], "req-b": [5, 6, 7]}, {"req-c": [1, 2, 3, 9, 9]}]

_SCENARIO = """
import json, os
from sglang.srt.server_args import ServerArgs
from sglang_harness import Scheduler
spec = json.loads({spec!r})
scheduler = Scheduler(ServerArgs(**spec["server_args"]), gpu_id=spec["gpu_id"], chunk_size=spec["chunk_size"])
outputs = scheduler.generate(spec["waves"], spec["max_new_tokens"])
print(json.dumps({{"pid": os.getpid(), "outputs": outputs, "overlap_thread": scheduler.overlap is not None}}))
"""


def standin_facts(version: str, module: str) -> contracts.ModuleFacts | None:
    """The facts of a stand-in module as Python sees its classes, or None where the version has no such module.

    ``contracts.extract_facts`` reads one file; a stand-in class may take fields from a base in
    ``sglang_common``, so the classes a module imports from there (and their bases there) are added
    under the names the module uses. A member in a shared base then counts for every version, both
    where the contract asks for it and where a release must lack it.
    """
    candidates = [FAMILIES[version] / rel for rel in contracts.module_relpaths(module)]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        return None
    tree = ast.parse(path.read_text(), filename=str(path))
    facts = contracts.extract_facts(tree)
    taken = [
        alias
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == COMMON.stem
        for alias in node.names
    ]
    if taken:
        assert all(alias.asname is None for alias in taken), f"{path}: import shared classes under their own names"
        shared = contracts.extract_facts(ast.parse(COMMON.read_text()), classes={alias.name for alias in taken})
        assert not facts["classes"].keys() & shared["classes"].keys(), f"{path} redefines a class of {COMMON.name}"
        facts["classes"].update(shared["classes"])
    return facts


def env_for(version: str, **overrides: str) -> dict[str, str]:
    """The shim, the stand-in of ``version`` and the shared test modules on PYTHONPATH."""
    return shim_env(FAMILIES[version], STANDINS, **overrides)


def write_config(folder: Path, name: str = "generate.json", **fields: object) -> Path:
    """An msprobe config (statistics, module level, no step/rank filter unless given) in ``folder``."""
    data = {"task": "statistics", "level": "L0", "dump_path": str(folder / "dump"), "rank": [], "step": []}
    data.update(fields)
    path = folder / name
    path.write_text(json.dumps(data))
    return path


def run_scenario(
    version: str,
    env: dict[str, str],
    *,
    server_args: dict | None = None,
    waves: list | None = None,
    max_new_tokens: int = 3,
    gpu_id: int = 0,
    chunk_size: int | None = None,
    cwd: str | os.PathLike | None = None,
) -> Result:
    spec = {
        "server_args": server_args or {},
        "waves": WAVES if waves is None else waves,
        "max_new_tokens": max_new_tokens,
        "gpu_id": gpu_id,
        "chunk_size": chunk_size,
    }
    return run_python(_SCENARIO.format(spec=json.dumps(spec)), env, cwd=cwd)


def dispatch_log(root: Path, pid: int) -> list[dict]:
    path = root / str(pid) / "dispatch_log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def step_folders(root: Path, pid: int) -> dict[int, list[str]]:
    """``{N: [rank folder names]}`` of the msprobe ``step{N}`` folders under ``{root}/{pid}``."""
    base = root / str(pid)
    return {
        int(p.name[4:]): sorted(c.name for c in p.iterdir())
        for p in base.iterdir()
        if p.is_dir() and p.name.startswith("step")
    }


def dumped_modules(root: Path, pid: int, step: int) -> set[str]:
    """Names of the model modules msprobe recorded in ``step{step}`` (any rank folder)."""
    (rank_dir,) = (root / str(pid) / f"step{step}").iterdir()
    data = json.loads((rank_dir / "dump.json").read_text())["data"]
    return {name for name in data if name.startswith("Module.")}
