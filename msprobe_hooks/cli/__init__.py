"""The ``msprobe-hooks`` command (also ``python -m msprobe_hooks``): one module of ``cli/`` per command.

Each command module has ``DESCRIPTION`` (its ``--help``, in the user's words), ``add_arguments(parser)``
and ``run(args) -> int`` (the exit status). Only the module of the command being run is imported, so
``msprobe-hooks shim-path`` and ``msprobe-hooks --help`` load nothing of the rest of the package.
"""

from msprobe_hooks.cli.command import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]
