"""The Ray ``runtime_env`` (and verl Hydra overrides) that switch the hooks on in every Ray worker.

Three Ray/Hydra facts shape the output:

* ``runtime_env.env_vars`` *replace* the cluster's value of a variable, so PYTHONPATH must be
  the whole path: the shim followed by this shell's entries, written out literally;
* Ray rejects non-string values, and Hydra turns ``=1`` into an int, so values are quoted;
* verl resolves its config later (``OmegaConf.resolve``), which fails on ``${...}``, so no value
  may contain an interpolation: every path is literal and absolute.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Mapping

from msprobe_hooks import config as config_module
from msprobe_hooks.cli.launch import job_environment

HYDRA_PREFIX = "++ray_kwargs.ray_init.runtime_env.env_vars."
_UNSAFE_FOR_HYDRA = set("$'\"\\\n")


def env_vars(environ: Mapping[str, str]) -> dict[str, str]:
    """String-valued env_vars for ``ray.init(runtime_env={"env_vars": ...})``."""
    env = job_environment({**environ, "DUMP_ON": "1"})
    names = ["PYTHONPATH"] + [v.name for v in config_module.VARIABLES]
    return {name: str(env[name]) for name in names if env.get(name) not in (None, "")}


def runtime_env(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    return {"env_vars": env_vars(environ)}


def hydra_overrides(environ: Mapping[str, str]) -> list[str]:
    """verl command-line overrides, one shell-quoted word each: ``'++ray_kwargs...env_vars.NAME="value"'``."""
    overrides = []
    for name, value in env_vars(environ).items():
        bad = sorted(_UNSAFE_FOR_HYDRA & set(value))
        if bad:
            raise ValueError(
                f"{name}={value!r} cannot be passed through Hydra (contains {''.join(bad)!r}); "
                "use `msprobe-hooks ray-env --format json` with ray.init(runtime_env=...) instead"
            )
        overrides.append(shlex.quote(f'{HYDRA_PREFIX}{name}="{value}"'))
    return overrides


# --- the command ---------------------------------------------------------------------------------

DESCRIPTION = """\
Print what a Ray cluster that did not inherit this shell's environment needs to activate the hooks in
every worker: verl command-line overrides (default) or the runtime_env for ray.init (--format json).
Ray replaces, never appends, a variable: PYTHONPATH is this shell's, written out literally."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=("hydra", "json"),
        default="hydra",
        help="hydra: verl command-line overrides (default); json: the runtime_env for ray.init",
    )


def run(args: argparse.Namespace) -> int:
    if args.format == "json":
        print(json.dumps(runtime_env(os.environ), indent=2))
        return 0
    try:
        overrides = hydra_overrides(os.environ)
    except ValueError as exc:
        print(f"msprobe-hooks ray-env: {exc}", file=sys.stderr)
        return 2
    print(
        "# verl overrides; PYTHONPATH is this shell's, written out literally (Ray replaces, never appends)",
        file=sys.stderr,
    )
    print(" \\\n".join(overrides))
    return 0
