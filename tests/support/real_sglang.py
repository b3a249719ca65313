"""The real SGLang engine (sglang 0.5.21 on CPU in ``.venv-sglang``), driven from the test venv.

SGLang pins its own transformers and torch, so it runs in its own environment (``make
install-sglang``, from ``requirements-sglang.txt``). Tests here build the model folder
(``examples/verl_cpu.build_model_dir``, the model verl's FSDP2 engine trains in the other tests),
copy its tokenizer files into a folder without ``config.json`` (with ``model_type=qwen2`` beside
them transformers 5 turns the WordLevel vocab into a BPE with no merges), and run
``tests/support/real_sglang_child.py``, plain SGLang user code, with ``.venv-sglang/bin/python``, the shim
and the test-only ``sgl_kernel`` stub on PYTHONPATH: the hooks come from the environment, as
under ``msprobe-hooks run``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from support import REPO, STANDINS
from support.interpreter import shim_env

SGLANG_VENV = REPO / ".venv-sglang"
CHILD = Path(__file__).resolve().parent / "real_sglang_child.py"
KERNEL_STUB = STANDINS / "sgl_kernel_stub"
# Engine start ~14 s on 2 cores, shutdown a few; a run is a few steps more.
TIMEOUT = 600
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def sglang_bin(name: str) -> Path:
    """A command of ``.venv-sglang``; a missing venv fails with the command that builds it."""
    path = SGLANG_VENV / "bin" / name
    assert path.exists(), f"{path} is missing: build the real-SGLang venv with `make install-sglang`"
    return path


def engine_env(**overrides: str) -> dict[str, str]:
    """The environment of a real SGLang run: shim and kernel stub on PYTHONPATH, the CPU engine, no TorchDynamo."""
    # Without SGLANG_USE_CPU_ENGINE the scheduler imports vLLM's custom ops.
    return shim_env(KERNEL_STUB, SGLANG_USE_CPU_ENGINE="1", TORCHDYNAMO_DISABLE="1", **overrides)


def tokenizer_dir(model_dir: Path, folder: Path) -> Path:
    """The model's tokenizer files in ``folder``, without the model's ``config.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, folder / name)
    return folder


@dataclass
class EngineRun:
    work: Path  # the child's working directory
    returncode: int
    stdout: str
    stderr: str
    report: dict | None  # the child's report (outputs, pid); None when it failed

    @property
    def outputs(self) -> dict[str, list[int]]:
        assert self.report is not None, f"SGLang run failed ({self.returncode}):\n{self.stderr[-4000:]}"
        return self.report["outputs"]


def run_engine(work: Path, scenario: Mapping, **env: str) -> EngineRun:
    """Run one scenario (see ``real_sglang_child.py``) in a fresh ``.venv-sglang`` interpreter, in ``work``."""
    python = sglang_bin("python")
    work.mkdir(parents=True, exist_ok=True)
    scenario_path, report_path = work / "scenario.json", work / "report.json"
    scenario_path.write_text(json.dumps(scenario))
    report_path.unlink(missing_ok=True)
    done = subprocess.run(
        [str(python), str(CHILD), str(scenario_path), str(report_path)],
        env=engine_env(**env),
        cwd=work,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    report = json.loads(report_path.read_text()) if done.returncode == 0 and report_path.exists() else None
    return EngineRun(work, done.returncode, done.stdout, done.stderr, report)
