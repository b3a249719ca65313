"""The command line: the parser of the command named in ``argv`` (only its module imported), and ``main``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> (module in cli/, the one line the command list shows)
COMMANDS: dict[str, tuple[str, str]] = {
    "shim-path": ("shim_path", "print the folder to put first on PYTHONPATH"),
    "env": ("env", "print the exports that switch the hooks on in this shell"),
    "run": ("run", "run CMD with the shim on PYTHONPATH (DUMP_ON as in your environment)"),
    "ray-env": ("ray_env", "print the Ray runtime_env / verl overrides for a cluster that did not inherit"),
    "doctor": ("doctor", "check this interpreter, the configuration and every patch"),
    "preflight": (
        "preflight",
        "check a verl config file, or a launch command (not run), for the consistency constraints",
    ),
    "recipe": ("recipe", "print the verl overrides and exports that pass every preflight check"),
    "align": ("align", "pair training prompt-only dumps with inference full-prefill dumps (writes pairs.jsonl)"),
    "compare": ("compare", "compare every pair module by module; report the first divergent module"),
    "gaps": ("gaps", "print the samples with the largest log-prob gap to the rollout, and how to dump just those"),
}


def _chosen(argv: list[str]) -> str | None:
    """The command named on the command line (the first word that is not an option), if it is one of ours."""
    word = next((arg for arg in argv if not arg.startswith("-")), None)
    return word if word in COMMANDS else None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with the arguments of the command ``argv`` names (every other command listed only)."""
    parser = argparse.ArgumentParser(
        prog="msprobe-hooks",
        description="msprobe precision dumps for verl + vLLM / vLLM-Ascend / SGLang, switched on by environment "
        "variables. See docs/user-guide.md.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    chosen = _chosen(sys.argv[1:] if argv is None else argv)
    for name, (module_name, text) in COMMANDS.items():
        if name != chosen:
            sub.add_parser(name, help=text)
            continue
        module = importlib.import_module(f"msprobe_hooks.cli.{module_name}")
        command = sub.add_parser(
            name, help=text, description=module.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        module.add_arguments(command)
        command.set_defaults(func=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from msprobe_hooks.config import ConfigError

    args = build_parser(argv).parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"msprobe-hooks: error: {problem}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of our output went away (`| head`): no traceback for that
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor at the interpreter's last flush
        return 128 + 13  # as a shell reports a command killed by SIGPIPE
