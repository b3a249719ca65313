"""Running ``tests/support/verl_engine_child.py`` (verl's real FSDP2 or Megatron engine on CPU), reading its output.

Shared by the engine tests, the fault suite (and by the Megatron stand-in's, with its own child);
one child process per configuration, at world size 1 or under torchrun at world size 2, with the
shim on PYTHONPATH so activation happens as in a user's job.
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

from cpu_kit import verl_cpu
from msprobe_hooks import join_keys
from support import zygote
from support.interpreter import shim_env

CHILD = Path(__file__).resolve().parent / "verl_engine_child.py"
# A hung collective fails the test through this limit; it is not a timing assertion.
HANG_LIMIT_S = 300

OPS = ["actor.log_prob", "ref.log_prob", "critic.values", "actor.update", "actor.log_prob"]
# Every engine test's samples: 4, in micro-batches of 2 (verl_cpu.random_samples(4, 0)).
SPEC = {"ops": OPS, "count": 4, "seed": 0, "micro_batch_size": 2}
SAMPLES = verl_cpu.random_samples(4, 0)
# verl's real Megatron engine (cpu_kit.megatron_cpu) on the same samples.
MEGATRON_SPEC = {**SPEC, "backend": "megatron"}
RESULT_KEYS = ("log_probs", "values", "loss", "grad_norm")


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
    fresh: bool = False,
    **env: str,
) -> EngineRun:
    """Run ``child`` with ``spec``; ``dump`` sets DUMP_ON=1; ``env`` adds variables (DUMP_PHASE, …);
    ``path`` goes on PYTHONPATH after the shim (a ``sitecustomize`` there is chained by the shim).

    The engine child at world size 1 is forked from the worker's zygote (``support.zygote``: verl imported
    already) unless ``fresh``; torchrun's ranks and other children are fresh interpreters."""
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / "report"
    out.mkdir(exist_ok=True)
    variables = {"MSPROBE_HOOKS_OUTPUT_DIR": str(tmp / "dumps"), "OMP_NUM_THREADS": "1", **env}
    if dump:
        variables["DUMP_ON"] = "1"
    argument = json.dumps({**spec, "out": str(out)})
    if world_size == 1 and child == CHILD and not fresh:
        stdout, stderr = tmp / "child.stdout", tmp / "child.stderr"
        returncode = zygote.run([str(child), argument], shim_env(*path, **variables), tmp, HANG_LIMIT_S, stdout, stderr)
        reports = _reports(out, world_size)
        return EngineRun(returncode, stderr.read_text(errors="replace"), reports, tmp / "dumps" / "actor")
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
    return EngineRun(done.returncode, done.stderr, _reports(out, world_size), tmp / "dumps" / "actor")


def _reports(out: Path, world_size: int) -> list[dict]:
    return [json.loads(p.read_text()) for p in (out / f"rank{r}.json" for r in range(world_size)) if p.is_file()]


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


def assert_same_outputs(run: EngineRun, baseline: EngineRun, indices: range, rank: int = 0) -> None:
    """The results of ops ``indices`` equal the baseline's exactly (log-probs, values, loss, grad norm)."""
    for i in indices:
        got, want = run.results(rank)[i], baseline.results(rank)[i]
        for key in RESULT_KEYS:
            assert got.get(key) == want.get(key), f"rank {rank}: {got['op']} {key} differs with DUMP_ON=1"


def seq_len(index: int, samples: list[verl_cpu.Sample] = SAMPLES) -> int:
    return len(samples[index].prompt) + len(samples[index].response)


def expected_sample(index: int, samples: list[verl_cpu.Sample] = SAMPLES, offset: int | None = 0) -> dict:
    """What the training log must say of ``samples[index]`` (all but its position in the micro-batch), at
    ``offset`` in its micro-batch's packed input (None: not one packed row)."""
    sample = samples[index]
    return {
        "uid": sample.uid,
        "session_id": sample.session_id,
        "request_id": sample.request_id,
        "request_ids": [sample.request_id],
        "prompt_len": len(sample.prompt),
        "prompt_hash": join_keys.prompt_hash(sample.prompt),
        "seq_len": len(sample.prompt) + len(sample.response),
        "offset": offset,
        "response_len": len(sample.response),
    }


def sample_fields(line: dict) -> list[dict]:
    """A log line's samples without their position in the micro-batch."""
    return [{k: v for k, v in s.items() if k != "index"} for s in line["samples"]]
