"""``msprobe-hooks doctor``: is this interpreter set up to activate, and would each patch apply?

Nothing here imports a patch target: patch eligibility is read from distribution metadata and
from the installed source files (parsed, not imported). ``--spawn-check`` starts real children
(spawn, fork, subprocess, a Ray task) and asks each whether it activated.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from msprobe_hooks import config as config_module
from msprobe_hooks import contracts, patching
from msprobe_hooks.bootstrap import current_config
from msprobe_hooks.cli.launch import shim_dir
from msprobe_hooks.debugger import MSPROBE_DISTRIBUTION, MSPROBE_MODULE, MSPROBE_SUPPORTED
from msprobe_hooks.patches import all_patches
from msprobe_hooks.registry import Patch

if TYPE_CHECKING:
    from multiprocessing.context import ForkContext, SpawnContext


def _sitecustomize_files(path: list[str]) -> list[str]:
    """Every sitecustomize module on ``path``, in import order (the first one wins)."""
    found = []
    for entry in path:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry or os.curdir])
        if spec is not None and spec.origin:
            found.append(os.path.abspath(spec.origin))
    return found


def probe() -> dict[str, object]:
    """What a (child) process says about itself; top level so that spawn can pickle it."""
    return {"pid": os.getpid(), "active": current_config() is not None}


def _probe_in_pipe(conn) -> None:  # multiprocessing target
    conn.send(probe())
    conn.close()


def _child_check(context: SpawnContext | ForkContext) -> dict[str, object]:
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_probe_in_pipe, args=(child,))
    process.start()
    child.close()
    result = parent.recv() if parent.poll(120) else {"error": "no answer within 120 s"}
    process.join(30)
    return result


def _subprocess_check() -> dict[str, object]:
    code = "import json, msprobe_hooks.cli.doctor as d; print(json.dumps(d.probe()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ray_check() -> dict[str, object]:
    try:
        import ray
    except ImportError:
        return {"skipped": "ray is not installed"}
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        return ray.get(ray.remote(probe).remote(), timeout=300)
    finally:
        if started:
            ray.shutdown()


SPAWN_CHECKS: dict[str, Callable[[], dict[str, object]]] = {
    "spawn": lambda: _child_check(multiprocessing.get_context("spawn")),
    "fork": lambda: _child_check(multiprocessing.get_context("fork")),
    "subprocess": _subprocess_check,
    "ray task": _ray_check,
}


def spawn_check(out: Callable[[str], None]) -> bool:
    """Run every child check; True when each child that ran reported the library active."""
    ok = True
    for name, check in SPAWN_CHECKS.items():
        try:
            result = check()
        except Exception as exc:  # a check that cannot run is a failed check, reported as such
            result = {"error": f"{type(exc).__name__}: {exc}"}
        if "skipped" in result:
            out(f"  {name:<10} skipped: {result['skipped']}")
            continue
        active = result.get("active") is True
        ok = ok and active
        detail = result.get("error") or f"pid {result.get('pid')}"
        out(f"  {name:<10} {'active' if active else 'NOT ACTIVE'} ({detail})")
    return ok


def patch_eligibility(patch: Patch) -> str:
    """One line: would this patch apply if its target were imported in this interpreter?"""
    provider = contracts.module_provider(patch.target)
    if provider is None:
        return f"{patch.distribution} not installed"
    version = provider.version
    problem = patching.version_problem(patch, version)
    if problem:
        return f"would be skipped: {problem}"
    facts: dict[str, contracts.ModuleFacts | None] = {}
    problems = []
    for item in patch.contract:
        if not contracts.applies(item, version):
            continue
        if item.module not in facts:
            facts[item.module] = contracts.installed_facts(item.module)
        problem = contracts.check_facts(item, facts[item.module])
        if problem:
            problems.append(problem)
    if problems:
        return f"would be skipped, target changed: {'; '.join(problems)}"
    return f"eligible ({provider.distribution} {version})"


def report(out: Callable[[str], None], with_spawn_check: bool = False) -> int:
    """Print the whole report; return the exit status (0 fine, 1 a spawn check failed, 2 bad config)."""
    status = 0
    out("interpreter")
    out(f"  {sys.executable} (Python {sys.version.split()[0]})")
    flags = [f for f in ("no_site", "ignore_environment", "isolated", "no_user_site") if getattr(sys.flags, f, 0)]
    out(f"  flags: {', '.join(flags) or 'none'}; venv: {'yes' if sys.prefix != sys.base_prefix else 'no'}")
    if {"no_site", "ignore_environment", "isolated"} & set(flags):
        out("  ! -S/-E/-I: this interpreter never runs a sitecustomize; the shim cannot activate here")

    here = shim_dir()
    out("shim")
    out(f"  folder: {here}")
    on_pythonpath = here in [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    out(f"  on PYTHONPATH: {'yes' if on_pythonpath else 'no  (msprobe-hooks env | run -- CMD)'}")
    files = _sitecustomize_files(sys.path)
    ours = os.path.join(here, "sitecustomize.py")
    if files and files[0] == ours:
        chained = files[1] if len(files) > 1 else "none"
        out(f"  winning sitecustomize: ours; it chains: {chained}")
    elif files:
        out(f"  ! winning sitecustomize is {files[0]}, not ours: put the shim folder first on PYTHONPATH")
    else:
        out("  no sitecustomize on sys.path")
    out(f"  ran in this process: {'yes' if 'msprobe_hooks_shim' in sys.modules else 'no'}")

    out("configuration")
    try:
        cfg = config_module.load()
    except config_module.ConfigError as exc:
        for problem in exc.problems:
            out(f"  ! {problem}")
        return 2
    out(f"  active in this process: {'yes' if current_config() is not None else 'no'}")
    out(f"  DUMP_ON={'1' if cfg.enabled else '0'}  DUMP_PHASE={cfg.dump_phase}  PROMPTS_ONLY={cfg.prompts_only}")
    out(f"  actor config: {cfg.actor_config or 'built-in'}; generate config: {cfg.generate_config or 'unset'}")
    out(f"  output dir: {cfg.output_dir}; strict: {cfg.strict}; disabled: {', '.join(sorted(cfg.disabled)) or 'none'}")
    for name in cfg.unknown_names:
        hint = config_module.suggest(name)
        out(f"  ! unknown variable {name}" + (f" (did you mean {hint}?)" if hint else ""))
    dynamo = config_module.VARIABLE["TORCHDYNAMO_DISABLE"]
    if os.environ.get(dynamo.name) != dynamo.suggested:
        out(
            f"  advice: export {dynamo.name}={dynamo.suggested} "
            "(msprobe hooks do not fire inside TorchDynamo-compiled code)"
        )
    if os.environ.get("RAY_ADDRESS"):
        out(
            "  advice: RAY_ADDRESS is set: workers of an existing cluster do not inherit this shell's "
            "environment; pass `msprobe-hooks ray-env` to the job"
        )

    out("msprobe")
    msprobe_version = contracts.module_version(MSPROBE_MODULE)
    if msprobe_version is None:
        out(f"  ! {MSPROBE_DISTRIBUTION} is not installed: pip install 'mindstudio-probe{MSPROBE_SUPPORTED}'")
    else:
        supported = contracts.version_supported(msprobe_version, MSPROBE_SUPPORTED)
        verdict = " (supported)" if supported else f"  ! supported: {MSPROBE_SUPPORTED}"
        out(f"  {MSPROBE_DISTRIBUTION} {msprobe_version}{verdict}")

    out("patches")
    try:
        patches = all_patches(cfg.extra_patches)
    except Exception as exc:
        out(f"  ! cannot load MSPROBE_HOOKS_EXTRA_PATCHES: {type(exc).__name__}: {exc}")
        patches = all_patches()
    if not patches:
        out("  none registered")
    for patch in patches:
        state = "disabled" if cfg.patch_disabled(patch.name) else patch_eligibility(patch)
        out(f"  {patch.name:<28} {state}")

    if with_spawn_check:
        out("spawn check (does each kind of child activate?)")
        if not spawn_check(out):
            status = 1
    return status


# --- the command ---------------------------------------------------------------------------------

DESCRIPTION = """\
Check this interpreter and configuration: is the shim first on PYTHONPATH, which sitecustomize it
chains, whether the variables are valid, whether msprobe is a supported version, and for every patch
whether its installed target still looks as the patch expects (read from the source files, not
imported). With --spawn-check, start spawn/fork/subprocess/Ray children and check each activates.
Exit status: 0 fine, 1 a child did not activate, 2 a bad configuration."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--spawn-check",
        action="store_true",
        help="also start spawn/fork/subprocess/Ray children and check that each activates",
    )


def run(args: argparse.Namespace) -> int:
    return report(print, with_spawn_check=args.spawn_check)
