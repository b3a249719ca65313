"""``msprobe-hooks env``: the exports that switch the hooks on in this shell."""

from __future__ import annotations

import argparse
import os

DESCRIPTION = """\
Print the export lines that put the shim on PYTHONPATH and pin every path variable to an absolute
path (the same dump root in every process of the job): eval "$(msprobe-hooks env)"."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No arguments."""


def run(args: argparse.Namespace) -> int:
    from msprobe_hooks.cli.launch import export_lines

    for line in export_lines(os.environ):
        print(line)
    return 0
