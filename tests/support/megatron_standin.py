"""The Megatron engine stand-in (``tests/standins/megatron_transformer_impl.py``) under verl's module name.

For what verl's real Megatron engine cannot do on this CPU (``test_verl_megatron_standin.py``): the
stand-in, checked against the patch's contract, is served for the real name, ahead of site-packages
(which hold the real module too), so that activation, version gate, contract check and patch run as
on verl's module.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys

from support import STANDINS

STANDIN = STANDINS / "megatron_transformer_impl.py"
TARGET = "verl.workers.engine.megatron.transformer_impl"


class _Finder:
    def find_spec(self, fullname, path=None, target=None):
        if fullname == TARGET:
            return importlib.util.spec_from_file_location(fullname, STANDIN)
        return None


def install() -> None:
    """From now on, importing :data:`TARGET` imports the stand-in (through the activation's import hooks)."""
    sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder), _Finder())
