"""One ordering of importing, patching and unpatching, in a fresh interpreter; what each step left.

Run by :mod:`support.patch_case` as ``python tests/support/patch_case_child.py '<json spec>'`` with
the site's folders on PYTHONPATH and no shim (the steps choose when activation happens). The spec:

* ``prelude``: code run once, right before the first ``import`` step (what the host does before
  importing the targets, e.g. register verl's CPU platform); ``targets``: patch name -> its target;
  ``imports``: the targets the site has, imported in this order;
* ``steps``: ``import`` (every target, in order), ``patch`` (``bootstrap.activate`` the first time,
  then every patch registered once more, as a second activation path would), ``unpatch``
  (``bootstrap.deactivate``: every patch reverted and every pending hook forgotten);
* ``environ``: what ``bootstrap.activate`` reads.

It prints one JSON object: per step, ``imported`` (target -> in sys.modules) and per patch its
``state``/``reason`` in ``patching.status()`` (None when unknown) and, read from the target module's
own functions and classes, ``wrapped`` (``Class.attribute`` names holding our wrapper of this patch),
``double`` (those whose wrapped object is itself ours) and ``changed`` (names whose object is not
the one found at the first import, our wrappers aside).
"""

from __future__ import annotations

import importlib
import json
import sys
from types import ModuleType
from typing import Any

from msprobe_hooks import bootstrap, patching
from msprobe_hooks.patches import PATCHES

SPEC = json.loads(sys.argv[1])


def members(module: ModuleType) -> dict[str, Any]:
    """The module's own functions and classes' attributes, by qualified name (what a patch can wrap)."""
    found: dict[str, Any] = {}
    for name, value in vars(module).items():
        found[name] = value
        if isinstance(value, type) and value.__module__ == module.__name__:
            found.update({f"{name}.{attribute}": member for attribute, member in vars(value).items()})
    return found


def observe(originals: dict[str, dict[str, Any]]) -> dict[str, Any]:
    status = {s.name: s for s in patching.status()}
    imported = {target: target in sys.modules for target in SPEC["targets"].values()}
    patches = {}
    for name, target in SPEC["targets"].items():
        found = members(sys.modules[target]) if imported[target] else {}
        ours = sorted(where for where, value in found.items() if patching.is_ours(value, name))
        first = originals.get(target, {})
        patches[name] = {
            "state": status[name].state if name in status else None,
            "reason": status[name].reason if name in status else None,
            "wrapped": ours,
            "double": [where for where in ours if patching.is_ours(found[where].__wrapped__, name)],
            "changed": sorted(
                where
                for where, value in first.items()
                if found.get(where) is not value and not patching.is_ours(found.get(where), name)
            ),
        }
    return {"imported": imported, "patches": patches}


def main() -> None:
    originals: dict[str, dict[str, Any]] = {}
    prelude_done = False
    trace = []
    for step in SPEC["steps"]:
        if step == "import":
            if not prelude_done:
                exec(SPEC["prelude"], {})
                prelude_done = True
            for target in SPEC["imports"]:
                first_time = target not in sys.modules
                module = importlib.import_module(target)
                if first_time and not patching.status():  # the unpatched originals, to check unpatch against
                    originals[target] = members(module)
        elif step == "patch":
            if bootstrap.current_config() is None:
                bootstrap.activate(dict(SPEC["environ"]))
            else:
                patching.register(PATCHES, bootstrap.current_config())
        elif step == "unpatch":
            bootstrap.deactivate()
        else:
            raise ValueError(f"unknown step {step!r}")
        trace.append({"step": step, **observe(originals)})
    print(json.dumps(trace))


if __name__ == "__main__":
    main()
