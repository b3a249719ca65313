"""``msprobe-hooks run -- CMD``: a command with the shim in front of it."""

from __future__ import annotations

import argparse
import os
import sys

DESCRIPTION = """\
Run CMD with the shim first on PYTHONPATH and every path variable made absolute, so that each Python
process CMD starts activates the hooks (when DUMP_ON=1): msprobe-hooks run -- bash run_grpo.sh"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG ...]")


def run(args: argparse.Namespace) -> int:
    from msprobe_hooks import config
    from msprobe_hooks.cli.launch import job_environment

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("msprobe-hooks run: no command given; usage: msprobe-hooks run -- CMD [ARG ...]", file=sys.stderr)
        return 2
    env = job_environment(os.environ)
    if not config.is_on(env.get("DUMP_ON")):
        print("msprobe-hooks run: DUMP_ON is not set: the shim is on PYTHONPATH but stays inactive", file=sys.stderr)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"msprobe-hooks run: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached
