"""Guard msprobe's own dump writes: a full disk must not become the host's exception.

msprobe writes its ``dump.json``/``stack.json``/``construct.json`` from
``DataWriter.write_json``, which it calls from inside its module hooks (a periodic flush during
the host's forward or backward), from ``stop()`` and at exit. A write that fails (no space left, a
read-only remount, the dump folder removed) raises ``RuntimeError("Save json file … failed.")``
there, straight through the host's ``loss.backward()``: seen on verl's FSDP2 engine with the dump
root on a full file system. The wrapper contains it and says, on one line, the cause and the step
folder lost (:func:`msprobe_hooks.storage.report_loss`).

Not in the catalogue of ``docs/patches.md`` (whose every entry is checked against released
files of a framework): it guards our own dependency and is registered beside the catalogue, in
every process that activates, whoever creates the debugger (us, verl's profiler, an engine).
"""

from __future__ import annotations

import os

from msprobe_hooks import patching, storage
from msprobe_hooks.contracts import Attribute, Method
from msprobe_hooks.registry import Patch

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: activation stays light
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

TARGET = "msprobe.core.dump.data_dump.json_writer"

PATCH = Patch(
    name="msprobe.writes",
    target=TARGET,
    implementation=__name__,
    distribution="mindstudio-probe",
    versions=">=26.2,<26.3",  # debugger.MSPROBE_SUPPORTED (not imported here: activation stays light)
    why="msprobe raises out of its own module hooks when a dump write fails (a full disk), through the "
    "host's forward or backward: the training job dies for a lost dump.",
    how="Wraps DataWriter.write_json: a failure is reported on one line (cause, device, step folder lost) "
    "and the host's call goes on; MSPROBE_HOOKS_STRICT=1 raises it.",
    retire_when="msprobe contains its own write failures.",
    contract=(
        Method(TARGET, "DataWriter.write_json", ("self",)),
        Attribute(TARGET, "DataWriter", "dump_file_path"),
    ),
)


def _step_folder(writer: Any) -> str:
    """``…/step3/rank0`` of the file being written, as the user finds it on disk."""
    path = getattr(writer, "dump_file_path", None) or ""
    folder = os.path.dirname(path)
    return os.path.join(os.path.basename(os.path.dirname(folder)), os.path.basename(folder)) or "(unknown)"


def _write_json(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    writer, _ = patching.bound(instance, args)
    try:
        result = wrapped(*args, **kwargs)
    except Exception as exc:
        path = os.path.dirname(getattr(writer, "dump_file_path", None) or ".")
        storage.report_loss(f"msprobe dump {_step_folder(writer)}", exc, path, patching.strict())
        return None
    storage.saved(f"msprobe dump {_step_folder(writer)}")  # each write rewrites the step's files whole
    return result


def patch(module: ModuleType, ctx: patching.PatchContext) -> None:
    ctx.wrap(module.DataWriter, "write_json", _write_json)
    storage.register_summary()  # now, before msprobe registers its exit flush: the summary follows it
