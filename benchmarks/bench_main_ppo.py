"""Cost of the hooks on verl's own trainer: ``python -m verl.trainer.main_ppo`` on CPU, hooks off against on.

The same run (:mod:`cpu_kit.main_ppo`: the v1 trainer, vLLM CPU as the rollout server, the FSDP2 actor, the weight
sync after every step) made twice, one after the other: with ``DUMP_ON`` unset and no shim, then with the hooks on
from the environment as a user switches them on (the shim first on PYTHONPATH, ``DUMP_ON=1 PROMPTS_ONLY=1``, msprobe
L0 statistics dumps on both sides). Prints verl's own ``timing_s/step`` of each global step side by side, the whole
run's wall time, and their ratios. Step 1 holds vLLM's first request (its warm-up); the later steps are the steady
state. Needs ``.venv-verl-e2e`` (``make install-verl-e2e``); about 3 minutes a run on 2 cores.

    python benchmarks/bench_main_ppo.py [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv-verl-e2e" / "bin" / "python"
CONFIG = REPO / "examples" / "msprobe_l0.json"
OURS = ("DUMP_", "MSPROBE_", "PROMPTS_ONLY")  # the variables that switch the hooks on or configure them


def launch(work: Path, steps: int, hooks: bool) -> tuple[float, dict[int, float]]:
    """One run in ``work``: its wall seconds and verl's seconds per global step."""
    sys.path.insert(0, str(REPO))
    from cpu_kit.main_ppo import Run

    env = {k: v for k, v in os.environ.items() if not k.startswith(OURS) and k != "PYTHONPATH"}
    if hooks:
        shim = subprocess.run(
            [str(PYTHON.parent / "msprobe-hooks"), "shim-path"], capture_output=True, text=True, check=True
        ).stdout.strip()
        env.update(
            PYTHONPATH=shim,
            DUMP_ON="1",
            PROMPTS_ONLY="1",
            MSPROBE_HOOKS_OUTPUT_DIR=str(work / "dumps"),
            MSPROBE_ACTOR_CONFIG=str(CONFIG),
            MSPROBE_GENERATE_CONFIG=str(CONFIG),
        )
    command = [str(PYTHON), "-m", "cpu_kit.main_ppo", str(work), "--steps", str(steps)]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"main_ppo failed ({'hooks on' if hooks else 'hooks off'}): {done.stdout[-2000:]}")
    run = Run.of(work)
    return run.wall_s, {step: metrics["timing_s/step"] for step, metrics in run.metrics().items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="global steps a run (default 3)")
    args = parser.parse_args()
    if not PYTHON.exists():
        print(f"skipped: {PYTHON} is missing (make install-verl-e2e)")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-main-ppo") as tmp:
        off_wall, off = launch(Path(tmp) / "off", args.steps, hooks=False)
        on_wall, on = launch(Path(tmp) / "on", args.steps, hooks=True)
    print(f"{'':24} {'hooks off':>10} {'hooks on':>10} {'on/off':>7}")
    for step in sorted(off):
        print(f"{f'global step {step} (s)':24} {off[step]:10.2f} {on[step]:10.2f} {on[step] / off[step]:7.2f}")
    later = [step for step in sorted(off) if step > 1]
    if later:
        steady_off, steady_on = (statistics.median(times[s] for s in later) for times in (off, on))
        print(f"{'steps 2+ median (s)':24} {steady_off:10.2f} {steady_on:10.2f} {steady_on / steady_off:7.2f}")
    print(f"{'whole run wall (s)':24} {off_wall:10.1f} {on_wall:10.1f} {on_wall / off_wall:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
