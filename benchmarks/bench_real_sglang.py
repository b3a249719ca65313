"""Cost of the dispatch log on the real SGLang engine (sglang 0.5.21 on CPU in ``.venv-sglang``): generation wall time.

Engines with the same model, the shim and the test ``sgl_kernel`` stub on PYTHONPATH
(``tests/support/real_sglang.py``), PAIRS of each kind: with ``DUMP_ON=1`` and no msprobe config (the
dispatch log alone, as in every rollout of a dumping job), and with ``DUMP_ON`` unset. All stay
up; each round runs one generation in every engine, in rotating order, so that load from elsewhere
on the machine falls on all alike. A generation is REQUESTS greedy requests in one ``generate``
call (decode forwards of REQUESTS rows). Prints the median per engine, the ratio of the log
engines' median to the others' (target <= 1.02), and the ratio between two engines of the same
kind: the noise floor an engine carries by itself. Needs ``make install-sglang``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from engine_rounds import close, report, run_rounds

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # cpu_kit, support

REQUESTS = 16
PROMPT_LEN = 16
MAX_NEW_TOKENS = 16
WARMUP = 2
ROUNDS = 10
PAIRS = 2


def _start(work: Path, name: str, scenario: Path, **env: str) -> subprocess.Popen:
    from support.real_sglang import CHILD, SGLANG_VENV, engine_env

    environ = engine_env(MSPROBE_HOOKS_OUTPUT_DIR=str(work / name), **env)
    command = [str(SGLANG_VENV / "bin" / "python"), str(CHILD), str(scenario), "-"]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL}
    return subprocess.Popen(command, env=environ, cwd=work, text=True, **pipes)


def main() -> int:
    from support.real_sglang import SGLANG_VENV, tokenizer_dir

    from cpu_kit import verl_cpu

    if not (SGLANG_VENV / "bin" / "python").exists():
        print("skipped: .venv-sglang is missing (make install-sglang)")
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench-real-sglang-", dir="/tmp"))
    children = {}
    try:
        model = Path(verl_cpu.build_model_dir(str(work / "model")))
        wave = [
            {
                "id": f"req-{i:03d}",
                "prompt": [3 + (i + j) % 120 for j in range(PROMPT_LEN)],
                "max_new_tokens": MAX_NEW_TOKENS,
            }
            for i in range(REQUESTS)
        ]
        scenario = work / "scenario.json"
        tokenizer = tokenizer_dir(model, work / "tokenizer")
        scenario.write_text(
            json.dumps({"model": str(model), "tokenizer": str(tokenizer), "waves": [wave], "serve": True})
        )
        for pair in range(PAIRS):
            children[f"off-{pair}"] = _start(work, f"off-{pair}", scenario)
            children[f"log-{pair}"] = _start(work, f"log-{pair}", scenario, DUMP_ON="1")
        times = run_rounds(children, WARMUP, ROUNDS)
        lines = sum(len(path.read_text().splitlines()) for path in work.glob("log-*/generate/*/dispatch_log.jsonl"))
    finally:
        close(children)
        shutil.rmtree(work, ignore_errors=True)
    title = "real SGLang (sglang 0.5.21, CPU): "
    title += f"{REQUESTS} requests x {MAX_NEW_TOKENS} tokens a generation, {ROUNDS} rounds"
    report(title, times, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
