"""The ``msprobe-hooks`` command (also ``python -m msprobe_hooks``)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from msprobe_hooks import config as config_module
from msprobe_hooks.cli import launch


def _cmd_shim_path(args: argparse.Namespace) -> int:
    print(launch.shim_dir())
    return 0


def _cmd_env(args: argparse.Namespace) -> int:
    for line in launch.export_lines(os.environ):
        print(line)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("msprobe-hooks run: no command given; usage: msprobe-hooks run -- CMD [ARG ...]", file=sys.stderr)
        return 2
    env = launch.job_environment(os.environ)
    if not config_module.is_on(env.get("DUMP_ON")):
        print("msprobe-hooks run: DUMP_ON is not set: the shim is on PYTHONPATH but stays inactive", file=sys.stderr)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"msprobe-hooks run: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


def _cmd_ray_env(args: argparse.Namespace) -> int:
    from msprobe_hooks.cli import ray_env

    if args.format == "json":
        print(json.dumps(ray_env.runtime_env(os.environ), indent=2))
        return 0
    try:
        overrides = ray_env.hydra_overrides(os.environ)
    except ValueError as exc:
        print(f"msprobe-hooks ray-env: {exc}", file=sys.stderr)
        return 2
    print(
        "# verl overrides; PYTHONPATH is this shell's, written out literally (Ray replaces, never appends)",
        file=sys.stderr,
    )
    print(" \\\n".join(overrides))
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from msprobe_hooks.cli import doctor

    return doctor.report(print, with_spawn_check=args.spawn_check)


def _cmd_preflight(args: argparse.Namespace) -> int:
    from msprobe_hooks import preflight

    return preflight.command(args.source, args.rollout_backend, print, lambda line: print(line, file=sys.stderr))


def _cmd_recipe(args: argparse.Namespace) -> int:
    from msprobe_hooks.preflight import recipe

    return recipe.command(
        args.backend,
        args.gpus,
        args.nnodes,
        args.rollout,
        args.generate_config or config_module.load().generate_config,
        args.tp,
        args.ep,
        out=print,
        err=lambda line: print(line, file=sys.stderr),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="msprobe-hooks",
        description="msprobe precision dumps for verl + vLLM / vLLM-Ascend / SGLang, switched on by environment "
        "variables. See docs/user-guide.md.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    sub.add_parser("shim-path", help="print the folder to put first on PYTHONPATH").set_defaults(func=_cmd_shim_path)
    sub.add_parser("env", help="print the exports that switch the hooks on in this shell").set_defaults(func=_cmd_env)
    run = sub.add_parser("run", help="run CMD with the shim on PYTHONPATH (DUMP_ON as in your environment)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG ...]")
    run.set_defaults(func=_cmd_run)
    ray = sub.add_parser(
        "ray-env", help="print the Ray runtime_env / verl overrides for a cluster that did not inherit"
    )
    ray.add_argument(
        "--format",
        choices=("hydra", "json"),
        default="hydra",
        help="hydra: verl command-line overrides (default); json: the runtime_env for ray.init",
    )
    ray.set_defaults(func=_cmd_ray_env)
    doctor = sub.add_parser("doctor", help="check this interpreter, the configuration and every patch")
    doctor.add_argument(
        "--spawn-check",
        action="store_true",
        help="also start spawn/fork/subprocess/Ray children and check that each activates",
    )
    doctor.set_defaults(func=_cmd_doctor)
    from msprobe_hooks.preflight import ROLLOUT_BACKENDS as backends
    from msprobe_hooks.preflight.recipe import TRAINING_BACKENDS

    check = sub.add_parser(
        "preflight",
        help="check a verl config file, or a launch command (not run), for the consistency constraints",
        description="Exit status: 0 no findings, 1 findings, 2 the config cannot be read. See docs/preflight.md.",
    )
    check.add_argument(
        "--rollout-backend",
        choices=backends,
        help="the inference engine (default: rollout.name, and vllm-ascend when trainer.device=npu or it is "
        "installed here)",
    )
    check.add_argument(
        "source", nargs=argparse.REMAINDER, help="CONFIG.yaml, or -- python3 -m verl.trainer.main_ppo ..."
    )
    check.set_defaults(func=_cmd_preflight)
    recipe = sub.add_parser("recipe", help="print the verl overrides and exports that pass every preflight check")
    recipe.add_argument("--backend", choices=TRAINING_BACKENDS, required=True, help="training backend")
    recipe.add_argument("--gpus", type=int, required=True, help="cards (GPUs or NPUs) per node")
    recipe.add_argument("--nnodes", type=int, default=1, help="nodes (default 1)")
    recipe.add_argument("--rollout", choices=backends, help="inference engine (default: the one installed here)")
    recipe.add_argument("--generate-config", help="inference msprobe config.json (default: $MSPROBE_GENERATE_CONFIG)")
    recipe.add_argument("--tp", type=int, default=1, help="Megatron: tensor parallel size of actor, ref and rollout")
    recipe.add_argument("--ep", type=int, default=1, help="Megatron: expert parallel size of actor, ref and rollout")
    recipe.set_defaults(func=_cmd_recipe)
    from msprobe_hooks.analysis import align, compare

    for name, module, text in (
        ("align", align, "pair training prompt-only dumps with inference full-prefill dumps (writes pairs.jsonl)"),
        ("compare", compare, "compare every pair module by module; report the first divergent module"),
    ):
        command = sub.add_parser(name, help=text, description=module.__doc__)
        module.add_arguments(command)
        command.set_defaults(func=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except config_module.ConfigError as exc:
        for problem in exc.problems:
            print(f"msprobe-hooks: error: {problem}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
