"""``msprobe-hooks shim-path``: the folder to put first on PYTHONPATH."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Print the folder holding msprobe-hooks' sitecustomize.py. Put it first on PYTHONPATH and every Python
process of the job activates the hooks when DUMP_ON=1:
    export PYTHONPATH=$(msprobe-hooks shim-path):$PYTHONPATH"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No arguments."""


def run(args: argparse.Namespace) -> int:
    from msprobe_hooks.cli.launch import shim_dir

    print(shim_dir())
    return 0
