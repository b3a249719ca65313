"""Running ``tests/support/verl_engine_child.py`` (verl's real FSDP2 engine on CPU) and reading what it left.

Shared by the engine tests (and by the Megatron stand-in's, with its own child); one child
process per configuration, at world size 1 or under torchrun at world size 2, with the shim on
PYTHONPATH so activation happens as in a user's job.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from support.interpreter import shim_env

CHILD = Path(__file__).resolve().parent / "verl_engine_child.py"
# A hung collective fails the test through this limit; it is not a timing assertion.
HANG_LIMIT_S = 300

OPS = ["actor.log_prob", "ref.log_prob", "critic.values", "actor.update", "actor.log_prob"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class EngineRun:
    returncode: int
    stderr: str
    reports: list[dict]
    dump_root: Path

    def results(self, rank: int = 0) -> list[dict]:
        return self.reports[rank]["results"]

    def log_lines(self, rank: int | None = None) -> list[dict]:
        """Every update_actor_log.jsonl line (all pids), of one rank if given, in msprobe step order."""
        lines = []
        for path in sorted(self.dump_root.glob("*/update_actor_log.jsonl")):
            lines += [json.loads(line) for line in path.read_text().splitlines()]
        lines = [line for line in lines if rank is None or line["rank"] == rank]
        return sorted(lines, key=lambda line: (line["rank"], line["step"]))

    def steps(self, rank: int = 0) -> list[int]:
        """The msprobe ``step{N}`` folders holding a dump of ``rank``."""
        found = [int(p.parent.parent.name[len("step") :]) for p in self.dump_root.glob(f"step*/rank{rank}/dump.json")]
        return sorted(found)

    def dump(self, step: int, rank: int = 0) -> dict:
        return json.loads((self.dump_root / f"step{step}" / f"rank{rank}" / "dump.json").read_text())["data"]


def run_engine(
    tmp: Path,
    spec: dict,
    *,
    world_size: int = 1,
    dump: bool = True,
    child: Path = CHILD,
    path: Sequence[str | os.PathLike] = (),
    **env: str,
) -> EngineRun:
    """Run ``child`` with ``spec``; ``dump`` sets DUMP_ON=1; ``env`` adds variables (DUMP_PHASE, …);
    ``path`` goes on PYTHONPATH after the shim (a ``sitecustomize`` there is chained by the shim)."""
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / "report"
    out.mkdir(exist_ok=True)
    variables = {"MSPROBE_HOOKS_OUTPUT_DIR": str(tmp / "dumps"), "OMP_NUM_THREADS": "1", **env}
    if dump:
        variables["DUMP_ON"] = "1"
    argument = json.dumps({**spec, "out": str(out)})
    if world_size == 1:
        command = [sys.executable, str(child), argument]
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={world_size}",
            f"--master_port={_free_port()}",
            str(child),
            argument,
        ]
    done = subprocess.run(
        command, env=shim_env(*path, **variables), capture_output=True, text=True, timeout=HANG_LIMIT_S, cwd=tmp
    )
    reports = []
    for rank in range(world_size):
        path = out / f"rank{rank}.json"
        if path.is_file():
            reports.append(json.loads(path.read_text()))
    return EngineRun(done.returncode, done.stderr, reports, tmp / "dumps" / "actor")


def write_config(path: Path, **settings: object) -> str:
    """An msprobe config.json: statistics, mix, no step filter, updated with ``settings``."""
    config = {
        "task": "statistics",
        "rank": [],
        "step": [],
        "level": "mix",
        "async_dump": False,
        "extra_info": True,
        "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
    }
    config.update(settings)
    path.write_text(json.dumps(config))
    return os.fspath(path)
