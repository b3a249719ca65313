"""The CPU kit's RL loop (``cpu_kit/rl_loop.py``) run from the tests, with the real engines and the hooks on.

The loop runs as a user runs it: the training venv's interpreter (this one) on the script, the
shim on PYTHONPATH, ``DUMP_ON=1 PROMPTS_ONLY=1`` and the demo's msprobe config (statistics, L0)
for both sides unless the caller sets others; the vLLM engine it starts in ``.venv-vllm`` inherits
that environment, so each side dumps every global step from the environment alone. Dumps go under
``WORK/dumps/{actor,generate}``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cpu_kit import demo_inputs
from msprobe_hooks.cli import main
from support import REPO
from support.interpreter import clean_env, shim_env
from support.real_sglang import SGLANG_VENV
from support.real_vllm import VLLM_PYTHON
from support.vllm_standin import dispatch_log, read_log

LOOP = REPO / "cpu_kit" / "rl_loop.py"
MSPROBE_CONFIG = REPO / "examples" / "msprobe_l0.json"
TENSOR_CONFIG = REPO / "examples" / "msprobe_l0_tensor.json"
# Both sides in tensor mode, whole sequences dumped: decode pairs, and the rollout's logits at each sampling step
TENSOR_ENV = {
    "MSPROBE_ACTOR_CONFIG": str(TENSOR_CONFIG),
    "MSPROBE_GENERATE_CONFIG": str(TENSOR_CONFIG),
    "DUMP_SEQUENCES": "1",
}
# Two engines start (~10 s verl, ~20-70 s vLLM on 2 cores), then ~1 s per global step.
TIMEOUT = 600
# fp32 on both sides, same weights: measured max |training - rollout| 4.8e-7 at step 1 and 9.5e-7
# after an update (3 steps, 4 prompts); the bound leaves 10x room.
FP32_GAP = 1e-5


@dataclass
class LoopRun:
    work: Path
    summary: dict

    @classmethod
    def of(cls, work: Path) -> LoopRun:
        """The loop run in ``work`` (dumps under ``work/dumps``, the script's ``--out`` at ``work/out``): by
        :func:`run_loop`, or by the demo (``examples/demo.sh``: one such folder per act)."""
        return cls(work, json.loads((work / "out" / "summary.json").read_text()))

    @property
    def steps(self) -> list[dict]:
        return self.summary["steps"]

    def samples(self, step: int = 1) -> list[dict]:
        """Global step ``step``'s samples (summary.json's)."""
        (found,) = [s for s in self.steps if s["global_step"] == step]
        return found["samples"]

    def pairs(self) -> Path:
        """``WORK/pairs.jsonl``: ``align``'s pairs of the run's dumps, as a user runs it (once)."""
        pairs = self.work / "pairs.jsonl"
        if not pairs.exists():
            assert main(["align", str(self.train_root), str(self.generate_root), "-o", str(pairs)]) == 0
        return pairs

    def diagnosis(self, name: str = "report", leave_out: tuple[str, ...] = ()) -> dict:
        """``compare``'s diagnosis of the run's pairs (``align``'s, as a user runs them) less those of the request
        ids ``leave_out``, in ``WORK/name``: a report answers for the pairs it is given."""
        pairs = self.pairs()
        kept = self.work / f"{name}.pairs.jsonl"
        lines = [line for line in pairs.read_text().splitlines() if json.loads(line)["key"] not in leave_out]
        kept.write_text("\n".join(lines) + "\n")
        assert main(["compare", str(kept), "-o", str(self.work / name)]) == 0
        return json.loads((self.work / name / "diagnosis.json").read_text())

    @property
    def train_root(self) -> Path:
        return self.work / "dumps" / "actor"

    @property
    def generate_root(self) -> Path:
        return self.work / "dumps" / "generate"

    def train_log(self) -> list[dict]:
        """The training side's ``update_actor_log.jsonl`` (one process: one log)."""
        (path,) = self.train_root.glob("*/update_actor_log.jsonl")
        return read_log(path)

    def worker_pid(self) -> int:
        """The process that ran vLLM's worker and dumped (one pid folder under the generate root)."""
        (folder,) = [p for p in self.generate_root.iterdir() if p.is_dir()]
        return int(folder.name)

    def dispatch_log(self) -> list[dict]:
        return dispatch_log(self.generate_root, self.worker_pid())


def _loop(work: Path, inputs: Path, args: tuple[str, ...], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The loop's command and environment, as a user runs it (see the module docstring)."""
    assert VLLM_PYTHON.exists(), f"{VLLM_PYTHON} is missing: build the real-vLLM venv with `make install-vllm`"
    work.mkdir(parents=True, exist_ok=True)
    environ = shim_env(
        **{
            "DUMP_ON": "1",
            "PROMPTS_ONLY": "1",
            "MSPROBE_HOOKS_OUTPUT_DIR": str(work / "dumps"),
            "MSPROBE_ACTOR_CONFIG": str(MSPROBE_CONFIG),
            "MSPROBE_GENERATE_CONFIG": str(MSPROBE_CONFIG),
            "TORCHDYNAMO_DISABLE": "1",
            **env,  # the caller's settings win
        }
    )
    command = [sys.executable, str(LOOP), "--model", str(inputs / "model"), "--prompts", str(inputs / "prompts.jsonl")]
    command += ["--out", str(work / "out"), "--vllm-python", str(VLLM_PYTHON), *args]
    return command, environ


def run_loop(work: Path, inputs: Path, *args: str, **env: str) -> LoopRun:
    """Run the loop on ``inputs`` (``cpu_kit.demo_inputs``' folder) in ``work``; ``args`` go to the script."""
    command, environ = _loop(work, inputs, args, env)
    log = work / "loop.log"
    with log.open("w") as handle:
        done = subprocess.run(command, env=environ, cwd=work, stdout=handle, stderr=subprocess.STDOUT, timeout=TIMEOUT)
    if done.returncode != 0:
        engine_log = work / "out" / "engine.log"
        tails = [
            f"--- {path} (end) ---\n" + "\n".join(path.read_text().splitlines()[-30:])
            for path in (log, engine_log)
            if path.exists()
        ]
        raise AssertionError(f"the RL loop failed ({done.returncode})\n" + "\n".join(tails))
    return LoopRun.of(work)


def demo_inputs_in(folder: Path) -> Path:
    """``folder`` holding the demo's model, its perturbed copy and prompts (``cpu_kit.demo_inputs``): the loop's
    inputs."""
    demo_inputs.build_models(folder)
    demo_inputs.write_prompts(folder / "prompts.jsonl")
    return folder


def run_sglang_loop(
    work: Path, inputs: Path, *args: str, engine_kwargs: dict | None = None, msprobe: Path = MSPROBE_CONFIG, **env: str
) -> LoopRun:
    """:func:`run_loop` with SGLang rolling out (``.venv-sglang``; ``engine_kwargs``: SGLang's own engine arguments),
    dumping through SGLang's own switch into ``work/dumps/generate`` (``msprobe``'s config, its dump path set)."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "sglang-msprobe.json"
    config.write_text(json.dumps({**json.loads(msprobe.read_text()), "dump_path": str(work / "dumps/generate")}))
    kwargs = {"msprobe_dump_config": str(config), **(engine_kwargs or {})}
    engine = ["--rollout-engine", "sglang", "--sglang-python", str(SGLANG_VENV / "bin" / "python")]
    return run_loop(work, inputs, *engine, "--rollout-engine-kwargs", json.dumps(kwargs), *args, **env)


def kill_loop(work: Path, inputs: Path, until: Callable[[Path], bool], *args: str) -> Path:
    """Run the loop as :func:`run_loop` does, in a session of its own, and SIGKILL the whole process tree (the trainer
    and the vLLM engine it started, both dumping) as soon as ``until(dumps folder)`` holds; the dumps folder."""
    command, environ = _loop(work, inputs, args, {})
    log = work / "loop.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            command, env=environ, cwd=work, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + TIMEOUT
            while not until(work / "dumps"):  # the kill point is a state of the dump tree, polled
                assert process.poll() is None, f"the loop ended ({process.returncode}) before its kill point: {log}"
                assert time.monotonic() < deadline, f"the kill point was not reached in {TIMEOUT} s: {log}"
                time.sleep(0.02)
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return work / "dumps"


def log_lines(root: Path, name: str) -> int:
    """The newlines in the ``{root}/{pid}/{name}`` logs so far (0 before the folder exists)."""
    return sum(path.read_bytes().count(b"\n") for path in root.glob(f"*/{name}"))


def run_demo(script: str, out: Path, timeout_s: float, *more_bins: Path) -> str:
    """An ``examples/`` demo script as the Makefile runs it (the two venvs' bin folders, then ``more_bins``, then the
    output folder ``out``), in a clean environment, within ``timeout_s``; what it printed on the terminal."""
    train_bin, vllm_bin = Path(sys.executable).parent, VLLM_PYTHON.parent
    command = ["bash", str(REPO / "examples" / script), str(train_bin), str(vllm_bin), *map(str, more_bins), str(out)]
    done = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def oracle_log_probs(
    model: torch.nn.Module,
    sample: dict,
    temperature: float = 1.0,
    *,
    fed: str = "prompt_token_ids",
    head_dtype: torch.dtype = torch.float32,
    decode_fault: tuple[str, float] | None = None,
) -> torch.Tensor:
    """log_softmax(logits / temperature) of the sample's response tokens after its prompt ``fed`` (training's, or
    ``rollout_prompt_token_ids``: what the rollout was fed), by transformers' forward of those ids, the lm_head
    applied in ``head_dtype`` (as vLLM's logits processor applies a ``head_dtype``: both operands cast).

    ``decode_fault`` (MODULE, FACTOR): MODULE's output scaled by FACTOR at the positions vLLM feeds in decode steps
    (every position after the prompt; a prefill feeds the prompt): what the CPU kit's decode-fault plugin computes.
    """
    prompt, response = sample[fed], sample["response_token_ids"]
    hooks = []
    if decode_fault is not None:
        name, factor = decode_fault

        def scale_decode_positions(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            scaled = output.clone()
            scaled[:, len(prompt) :] *= factor
            return scaled

        hooks.append(model.get_submodule(name).register_forward_hook(scale_decode_positions))
    try:
        with torch.no_grad():
            hidden = model.model(torch.tensor([prompt + response])).last_hidden_state[0]
    finally:
        for hook in hooks:
            hook.remove()
    hidden = hidden[len(prompt) - 1 : len(prompt) - 1 + len(response)]
    logits = torch.nn.functional.linear(hidden.to(head_dtype), model.lm_head.weight.to(head_dtype)).float()
    return torch.log_softmax(logits / temperature, dim=-1).gather(1, torch.tensor(response)[:, None])[:, 0]


def reference_model(folder: Path, **overrides: Any) -> torch.nn.Module:
    """A checkpoint folder in transformers, fp32, eval: the oracle's model (``overrides`` go to ``from_pretrained``)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **overrides).eval()


def largest_gap(values: torch.Tensor, logged: list[float]) -> float:
    return float((values.detach() - torch.tensor(logged)).abs().max())
