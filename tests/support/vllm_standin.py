"""Running the stand-in vLLM / vLLM-Ascend (tests/standins/vllm_site) in fresh interpreters with the shim active."""

from __future__ import annotations

import json
from pathlib import Path

from support import STANDINS
from support.interpreter import Result, run_python, shim_env

SITE = STANDINS / "vllm_site"

PROMPTS = {
    "A": [1, 2, 3, 4, 5, 6],
    "B": list(range(10, 20)),
    "C": [1, 2, 3, 4, 40, 41, 42],  # shares A's first block (4 tokens): a prefix-cache hit
    "D": [7, 8, 9],
}
# Token budget 8: B's prefill is cut into chunks; C arrives at step 2; D after every other request
# has finished, so steps with no tokens (freeing finished requests) run before and after it.
MIXED = {
    "budget": 8,
    "prefix_caching": True,
    "requests": [
        {"id": "A", "prompt": PROMPTS["A"], "max_tokens": 3},
        {"id": "B", "prompt": PROMPTS["B"], "max_tokens": 2},
        {"id": "C", "prompt": PROMPTS["C"], "max_tokens": 2, "at_step": 2},
        {"id": "D", "prompt": PROMPTS["D"], "max_tokens": 1, "at_step": 6},
    ],
}
# Per model step, rows in packed (input_batch) order:
# (client id, type, prefill, tokens, offset, computed before, prompt length, full prefill)
MIXED_ROWS = [
    [("A", "new", True, 6, 0, 0, 6, True), ("B", "new", True, 2, 6, 0, 10, False)],
    [("A", "cached", False, 1, 0, 6, 6, False), ("B", "cached", True, 7, 1, 2, 10, False)],
    [("A", "cached", False, 1, 0, 7, 6, False), ("B", "cached", True, 1, 1, 9, 10, False),
     ("C", "new", True, 3, 2, 4, 7, False)],
    # A's row was freed and condensed: C moved in front of B, unlike the scheduler's order (B, C)
    [("C", "cached", False, 1, 0, 7, 7, False), ("B", "cached", False, 1, 1, 10, 10, False)],
    [("D", "new", True, 3, 0, 0, 3, True)],
]  # fmt: skip
# The published two phases: a step with any prefill row is "prefill"; prefill_requests counts those rows.
MIXED_PHASES = ["prefill", "prefill", "prefill", "decode", "prefill"]
MIXED_PREFILL_REQUESTS = [2, 1, 2, 0, 1]


def row_tuples(line: dict) -> list[tuple]:
    """A line's rows in the shape of MIXED_ROWS."""
    keys = ("request_id_base", "type", "prefill", "tokens", "offset", "computed_tokens", "prompt_len", "full_prefill")
    return [tuple(row[k] for k in keys) for row in line["requests"]]


def generate_config(tmp_path: Path, **fields) -> Path:
    config = {"task": "statistics", "level": "L0", "rank": [], "dump_path": str(tmp_path / "gen"), **fields}
    path = tmp_path / "generate.json"
    path.write_text(json.dumps(config))
    return path


def dump_of(root: Path, pid: int, step: int, rank: int = 0) -> dict:
    return json.loads((root / str(pid) / f"step{step}" / f"rank{rank}" / "dump.json").read_text())["data"]


def dumped_steps(root: Path, pid: int) -> list[str]:
    """The ``step{N}`` folders of process ``pid`` that hold a dump.json, in step order."""
    names = {p.parent.parent.name for p in (root / str(pid)).glob("step*/rank*/dump.json")}
    return sorted(names, key=lambda name: int(name[4:]))


def standin_site(root: Path, vllm: str = "0.23.0", vllm_ascend: str | None = None) -> Path:
    """A folder of dist-infos that give the stand-ins their versions (the packages stay in SITE)."""
    site = root / f"site-{vllm}-{vllm_ascend}"
    for name, dist, version in (("vllm", "vllm", vllm), ("vllm_ascend", "vllm-ascend", vllm_ascend)):
        if version:
            info = site / f"{name}-{version}.dist-info"
            info.mkdir(parents=True, exist_ok=True)
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return site


def run_child(root: Path, program: str, *, vllm: str = "0.23.0", vllm_ascend: str | None = None, **env: str) -> Result:
    """Run ``program`` with the stand-ins at these versions, the shim on and DUMP_ON=1 (unless overridden)."""
    site = standin_site(root, vllm, vllm_ascend)
    env.setdefault("DUMP_ON", "1")
    env.setdefault("MSPROBE_HOOKS_OUTPUT_DIR", str(root / "out"))
    env.setdefault("TORCHDYNAMO_DISABLE", "1")
    return run_python(program, shim_env(site, SITE, **env), cwd=root)


def run_scenario(root: Path, scenario: dict, *, code: str = "", **kwargs: str) -> Result:
    """Run ``standin_drive.run(scenario)``; the child prints its report as its last line.

    ``code`` runs after the scenario with ``report`` in scope and may add keys to it.
    """
    program = (
        "import json, standin_drive\n"
        f"report = standin_drive.run(json.loads({json.dumps(json.dumps(scenario))}))\n"
        f"{code}\n"
        "print(json.dumps(report))\n"
    )
    return run_child(root, program, **kwargs)


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def dispatch_log(root: Path, pid: int) -> list[dict]:
    return read_log(root / str(pid) / "dispatch_log.jsonl")
