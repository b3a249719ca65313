"""The golden dump trees (``tests/golden/``, cut from real engine runs by ``scripts/make_golden.py``).

A tree is copied into a test's own folder before use: tests that plant a fault edit their copy.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from support import REPO

GOLDEN = REPO / "tests" / "golden"
PROMPTS = {"req-0": [5, 17, 42, 9, 77, 23], "req-1": [64, 3, 31, 90]}  # scripts/make_golden.py's
LAYERS = 2


def copy(name: str, into: Path) -> Path:
    """``tests/golden/NAME`` copied to ``into/NAME``."""
    target = into / name
    shutil.copytree(GOLDEN / name, target)
    return target


def dumps(root: Path) -> list[Path]:
    return sorted(root.rglob("dump.json"))


def edit_entries(root: Path, edit: Callable[[str, dict], None]) -> None:
    """Call ``edit(name, entry)`` on every entry of every dump.json under ``root``, and write them back."""
    for path in dumps(root):
        data = json.loads(path.read_text())
        for name, entry in data["data"].items():
            edit(name, entry)
        path.write_text(json.dumps(data))


def scale_output(root: Path, module: str, factor: float, output: int = 0, io: str = "output") -> int:
    """Multiply the statistics of output (``io="input"``: input) ``output`` of every ``Module.*{module}.*``
    entry by ``factor``.

    What a weight scaled by ``factor`` does to that module's output (max, min, mean and norm scale
    with it); downstream modules are left as they were, as a planted fault of known place. Returns
    how many entries were changed.
    """
    changed = 0

    def edit(name: str, entry: dict) -> None:
        nonlocal changed
        if not name.startswith("Module.") or f".{module}." not in name:
            return
        outputs = entry.get("output" if io == "output" else "input_args")
        tensor = outputs[output] if isinstance(outputs, list) else outputs
        for stat in ("Max", "Min", "Mean", "Norm"):
            if isinstance(tensor.get(stat), (int, float)):
                tensor[stat] *= factor
        changed += 1

    edit_entries(root, edit)
    return changed
