"""Real dump pairs for the compare tests: verl's FSDP2 engine on one side, vLLM's or SGLang's CPU engine on the other.

All sides run as a user runs them: ``examples/cpu_demo.py --model --prompts`` with the shim and
``DUMP_ON=1 PROMPTS_ONLY=1``; ``examples/vllm_generate.py`` in the vLLM environment
(``<repo>/.venv-vllm``) with ``MSPROBE_GENERATE_CONFIG``; ``sglang.Engine`` in the SGLang
environment (``<repo>/.venv-sglang``, ``tests/support/real_sglang.py``) with SGLang's own
``msprobe_dump_config`` and ``DUMP_ON=1``. Same weights (or a copy with one known module changed),
same prompts, same request ids, one request per prefill step.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pandas

from cpu_kit.demo_inputs import read_prompts
from support import REPO, zygote
from support.interpreter import shim_env
from support.real_sglang import run_engine, tokenizer_dir
from support.real_vllm import VLLM_PYTHON, engine_env
from support.real_vllm import run_engine as run_vllm_engine
from support.verl_runs import HANG_LIMIT_S

EXAMPLES = REPO / "examples"

# Tokens generated per prompt on the inference side (a prefill, then decodes align leaves out).
MAX_NEW_TOKENS = 2


def cores(ranks: int) -> str:
    """One core per rank, as vLLM's and SGLang's CPU engines want them named (``"0|1"``; wrapping round)."""
    return "|".join(str(rank % (os.cpu_count() or 1)) for rank in range(ranks))


def msprobe_config(path: Path, task: str = "statistics", level: str = "L0", step: list[int] | None = None) -> str:
    """An msprobe config.json for both sides (no step filter unless ``step``: the hooks choose what is dumped)."""
    config = {
        "task": task,
        "rank": [],
        "step": step or [],
        "level": level,
        "async_dump": False,
        "extra_info": True,
        task: {"scope": [], "list": [], "data_mode": ["all"]},
    }
    if task == "statistics":
        config[task]["summary_mode"] = "statistics"
    path.write_text(json.dumps(config))
    return os.fspath(path)


def _run(command: list[str], env: dict[str, str], log: Path) -> None:
    """``command``'s output in ``log``; a script of this interpreter forked from the zygote (``support.zygote``)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    if command[0] == sys.executable and command[1].endswith(".py"):
        returncode = zygote.run(command[1:], env, REPO, HANG_LIMIT_S, log)
    else:
        with log.open("w") as out:
            returncode = subprocess.run(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=HANG_LIMIT_S, cwd=REPO
            ).returncode
    assert returncode == 0, f"{command[1]} failed ({returncode}); last lines:\n" + "\n".join(
        log.read_text().splitlines()[-30:]
    )


def run_training(
    tmp: Path,
    model: Path,
    prompts: Path,
    config: str,
    world_size: int = 1,
    extra: Sequence[str] = (),
    engine: str = "fsdp",
    tensor_parallel: int = 1,
    **hooks: str,
) -> Path:
    """verl's FSDP2 (or Megatron) engine, one prompt-only dump per prompt; returns the training dump root.

    ``world_size`` 2 runs it under torchrun (gloo): each data-parallel rank dumps its contiguous share of the
    prompts. ``extra``: more arguments of ``examples/cpu_demo.py`` (``--log-prob-only``). ``engine``
    ``megatron`` at ``tensor_parallel`` k runs k ranks (at least) sharing the prompts. ``hooks`` are more of the
    hooks' variables, over ``PROMPTS_ONLY=1`` (``DUMP_SEQUENCES``, ``DUMP_REQUEST_IDS``, ...). The prompts file may
    carry the rollout's responses (``examples/cpu_demo.py``).
    """
    env = shim_env(
        DUMP_ON="1",
        MSPROBE_HOOKS_OUTPUT_DIR=os.fspath(tmp),
        MSPROBE_ACTOR_CONFIG=config,
        TORCHDYNAMO_DISABLE="1",
        OMP_NUM_THREADS="1",
        **{"PROMPTS_ONLY": "1", **hooks},
    )
    command = [sys.executable, os.fspath(EXAMPLES / "cpu_demo.py"), "--model", os.fspath(model), "--prompts"]
    if engine != "fsdp":
        extra = (*extra, "--engine", engine, "--tensor-parallel", str(tensor_parallel))
    world_size = max(world_size, tensor_parallel)
    if world_size > 1:
        with socket.socket() as sock:  # a free port for torchrun's rendezvous
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        launcher = ["-m", "torch.distributed.run", f"--nproc_per_node={world_size}", f"--master_port={port}"]
        command = [command[0], *launcher, *command[1:]]
    _run([*command, os.fspath(prompts), *extra], env, tmp / "train.log")
    return tmp / "actor"


def run_sglang(tmp: Path, model: Path, prompts: Path, config: str, tp: int = 1) -> Path:
    """SGLang's CPU engine (``tp`` ranks), one prompt per ``generate`` call; returns the inference dump root."""
    waves = [
        [{"id": p["request_id"], "prompt": p["prompt_token_ids"], "max_new_tokens": MAX_NEW_TOKENS}]
        for p in read_prompts(os.fspath(prompts))
    ]
    root, outputs = run_sglang_waves(tmp, model, waves, config, tp=tp)
    assert {rid: len(ids) for rid, ids in outputs.items()} == {w[0]["id"]: MAX_NEW_TOKENS for w in waves}
    return root


def run_sglang_waves(
    tmp: Path, model: Path, waves: list[list[dict]], config: str, engine: dict | None = None, tp: int = 1
) -> tuple[Path, dict[str, list[int]]]:
    """SGLang's CPU engine on ``waves`` (``real_sglang_child.py``: the requests of a wave in one ``generate``
    call, so SGLang packs them), keyword arguments ``engine`` over the radix cache off; returns the inference
    dump root and the generated tokens per request id.

    SGLang 0.5.11+ dumps through its own switch (``msprobe_dump_config``), which needs the
    ``dump_path`` in the config: a copy of ``config`` names ``tmp/generate``. The radix cache is off,
    so every prefill holds its whole prompt (a chunk of it where ``engine`` chunks prefills). ``tp`` > 1 binds
    one core per rank (``SGLANG_CPU_OMP_THREADS_BIND``, which SGLang's CPU engine asks for).
    """
    root = tmp / "generate"
    tmp.mkdir(parents=True, exist_ok=True)
    native = tmp / "sglang-config.json"
    native.write_text(json.dumps({**json.loads(Path(config).read_text()), "dump_path": os.fspath(root)}))
    scenario = {
        "model": os.fspath(model),
        "tokenizer": os.fspath(tokenizer_dir(model, tmp / "tokenizer")),
        "engine": {
            "msprobe_dump_config": os.fspath(native),
            "disable_radix_cache": True,
            "tp_size": tp,
            **(engine or {}),
        },
        "waves": waves,
    }
    bind = {"SGLANG_CPU_OMP_THREADS_BIND": cores(tp)} if tp > 1 else {}
    run = run_engine(tmp / "sglang", scenario, DUMP_ON="1", **bind)
    return root, run.outputs


def run_vllm(
    tmp: Path,
    model: Path,
    prompts: Path,
    config: str,
    dtype: str = "float32",
    tp: int = 1,
    root: Path | None = None,
    **env_vars: str,
) -> Path:
    """vLLM's CPU engine (in ``dtype``, ``tp`` workers), one request per prefill step; returns the inference dump root.

    ``tp`` > 1 binds one core per worker (``VLLM_CPU_OMP_THREADS_BIND``, what vLLM's CPU workers need on
    one NUMA node). ``root``: the generate dump root (default ``tmp/generate``); two runs given the same
    root leave their dumps side by side, as two replicas of one job do. ``env_vars`` are set too
    (``MSPROBE_HOOKS_ROUTING="1"``). At ``tp`` 1 the engine core runs in the script's process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: one interpreter start, not three; the dumps are the model runner's either
    way, and ``test_real_vllm`` dumps through vLLM's spawned worker).
    """
    if tp == 1:
        env_vars = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **env_vars}
    assert VLLM_PYTHON.exists(), f"{VLLM_PYTHON} is missing: build the real-vLLM venv with `make install-vllm`"
    rpc = tempfile.mkdtemp(prefix="vllm-rpc")  # short: socket paths must stay under 107 bytes
    root = root or tmp / "generate"
    config = _with_dump_path(Path(config), tmp / "generate-config.json", root) if root != tmp / "generate" else config
    env = engine_env(
        rpc, DUMP_ON="1", MSPROBE_GENERATE_CONFIG=config, MSPROBE_HOOKS_OUTPUT_DIR=os.fspath(tmp), **env_vars
    )
    if tp > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores(tp)
    command = [os.fspath(VLLM_PYTHON), os.fspath(EXAMPLES / "vllm_generate.py"), os.fspath(model), os.fspath(prompts)]
    command += ["--dtype", dtype, "--tensor-parallel-size", str(tp)]
    try:
        _run(command, env, tmp / "vllm.log")
    finally:
        shutil.rmtree(rpc, ignore_errors=True)
    return root


def _with_dump_path(config: Path, copy: Path, root: Path) -> str:
    """A copy of the msprobe config ``config`` whose ``dump_path`` is ``root``."""
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(json.dumps({**json.loads(config.read_text()), "dump_path": os.fspath(root)}))
    return os.fspath(copy)


def run_vllm_scenario(tmp: Path, scenario: dict, config: str) -> tuple[Path, dict]:
    """vLLM's CPU engine on a ``real_vllm_child.py`` scenario, its engine core in this process (so the waves
    alone say what each step packs); returns the inference dump root and the child's report."""
    env = {"DUMP_ON": "1", "MSPROBE_GENERATE_CONFIG": config, "MSPROBE_HOOKS_OUTPUT_DIR": os.fspath(tmp)}
    run = run_vllm_engine(tmp / "vllm", scenario, VLLM_ENABLE_V1_MULTIPROCESSING="0", **env)
    assert run.report is not None, f"vLLM run failed ({run.returncode}):\n{run.stderr[-4000:]}"
    return tmp / "generate", run.report


def align(train_root: Path, generate_root: Path, path: Path) -> list[dict]:
    """``msprobe-hooks align`` on the two trees, as a user runs it; the pairs it wrote."""
    command = [sys.executable, "-m", "msprobe_hooks", "align", os.fspath(train_root), os.fspath(generate_root)]
    done = subprocess.run([*command, "-o", os.fspath(path)], capture_output=True, text=True, timeout=HANG_LIMIT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in path.read_text().splitlines()]


def unpaired_table(stdout: str) -> dict[str, tuple[int, int]]:
    """The unpaired table ``align`` prints: reason -> (training dumps, generate dumps)."""
    rows = {}
    for line in stdout.splitlines():
        parts = line.rsplit(None, 2)
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            rows[parts[0].strip()] = (int(parts[1]), int(parts[2]))
    return rows


def run_compare(
    pairs_file: Path, out: Path, *extra: str, status: int = 0
) -> tuple[subprocess.CompletedProcess, pandas.DataFrame, pandas.DataFrame]:
    """``msprobe-hooks compare`` on a pairs file, as a user runs it; its stdout, pairs.csv and modules.csv."""
    done = subprocess.run(
        [sys.executable, "-m", "msprobe_hooks", "compare", str(pairs_file), "-o", str(out), "--jobs", "2", *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == status, done.stderr
    return done, pandas.read_csv(out / "pairs.csv"), pandas.read_csv(out / "modules.csv")


def raw_pairs(path: Path | str) -> list[dict]:
    """The lines of a pairs file as JSON objects, dump paths resolved (``pairs.read`` gives typed pairs)."""
    from msprobe_hooks.analysis.pairing import pairs

    return [pair.record() for pair in pairs.read(str(path))]


def write_raw(records: list[dict], path: Path | str) -> None:
    """Write edited pairs lines (JSON objects, as :func:`raw_pairs` gives them) as a pairs file."""
    from msprobe_hooks.analysis.pairing import pairs

    pairs.write([pairs.Pair.from_record(record) for record in records], str(path))
