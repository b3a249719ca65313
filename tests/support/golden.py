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


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_lines(path: Path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))


def two_step_run(into: Path, *, ids: bool, times: bool) -> tuple[Path, Path]:
    """(training root, generate root) of a run of two global steps made from the golden FSDP2 and vLLM trees.

    Global step g's rollout (the vLLM steps, copied) comes before its training dumps (the FSDP2 ones,
    copied with ``global_step`` g): the same prompts in both steps, as every epoch brings them back.
    ``ids``: request ids unique per rollout (``g{g}-req-i``), else none on either side (the prompt hash
    is all a join has). ``times``: the lines carry the ``time`` field, rollout g at 100 g s, its training
    at 100 g + 50 s; else neither side says when.
    """
    train, generate = into / "actor", into / "generate"
    (train_log,) = (GOLDEN / "fsdp2" / "actor").glob("*/update_actor_log.jsonl")
    (gen_log,) = (GOLDEN / "vllm" / "generate").glob("*/dispatch_log.jsonl")
    train_lines, gen_lines = _lines(train_log), _lines(gen_log)
    out_train, out_gen = [], []
    for g in (1, 2):
        for line in gen_lines:
            step = line["step"] + (g - 1) * len(gen_lines)
            source = gen_log.parent / f"step{line['step']}"
            shutil.copytree(source, generate / gen_log.parent.name / f"step{step}")
            copy = json.loads(json.dumps(line))
            copy["step"] = step
            for row in copy["requests"]:
                if ids:
                    row["request_id"] = f"g{g}-{row['request_id']}"
                    row["request_id_base"] = f"g{g}-{row['request_id_base']}"
                else:
                    row["request_id"] = row["request_id_base"] = None
            if times:
                copy["time"] = 100.0 * g + step
            out_gen.append(copy)
        for line in train_lines:
            step = line["step"] + (g - 1) * len(train_lines)
            shutil.copytree(train_log.parent.parent / f"step{line['step']}", train / f"step{step}")
            copy = json.loads(json.dumps(line))
            copy["step"], copy["global_step"] = step, g
            for sample in copy["samples"]:
                new = f"g{g}-{sample['request_id']}" if ids else None
                sample["request_id"], sample["request_ids"] = new, [new] if new else []
            copy["request_ids"] = [s["request_id"] for s in copy["samples"] if s["request_id"]]
            if times:
                copy["time"] = 100.0 * g + 50 + step
            out_train.append(copy)
    (train / train_log.parent.name).mkdir(parents=True)
    _write_lines(train / train_log.parent.name / train_log.name, out_train)
    _write_lines(generate / gen_log.parent.name / gen_log.name, out_gen)
    return train, generate


# --- the decode set (tests/golden/decode: tensor mode, .npy tensor files) ------------------------------------

DECODE = GOLDEN / "decode"


def as_statistics(root: Path) -> None:
    """Rewrite every tensor-mode dump under ``root`` as msprobe's statistics mode writes the same forward.

    msprobe writes the same entries with the same statistics in both modes; tensor mode adds each tensor's
    file name (``data_name``) and folder (``dump_data_dir``) and the files. So: task ``statistics``, no names,
    no folder, no files (``test_decode`` checks this on the namings set's real statistics and tensor trees).
    """

    def without_files(entry: object) -> object:
        if isinstance(entry, dict):
            return {k: without_files(v) for k, v in entry.items() if k != "data_name"}
        if isinstance(entry, list):
            return [without_files(v) for v in entry]
        return entry

    for path in dumps(root):
        data = json.loads(path.read_text())
        data.update(task="statistics", dump_data_dir=None, data=without_files(data["data"]))
        path.write_text(json.dumps(data))
        shutil.rmtree(path.parent / "dump_tensor_data", ignore_errors=True)


def tensor_file(dump: Path, module: str, io: str = "output", index: int = 0) -> Path:
    """The tensor file of ``io`` ``index`` of the one ``Module.*{module}.*`` entry of ``dump`` (a dump.json)."""
    data = json.loads(dump.read_text())["data"]
    (name,) = [n for n in data if n.startswith("Module.") and f".{module}." in n]
    tensors = data[name]["output" if io == "output" else "input_args"]
    return dump.parent / "dump_tensor_data" / tensors[index]["data_name"]


def scale_rows(dump: Path, module: str, rows: tuple[int, int], factor: float, io: str = "output") -> None:
    """Multiply token rows ``[start, stop)`` of one module's dumped tensor (``.npy``) by ``factor``, in place.

    A fault of known place and size in the tensors of one step: the rows of one request (an inference step
    packs several) or of one position (a training sequence). The token dimension is the second of a training
    ``[1, T, H]`` tensor, the first of an inference ``[T, H]`` one. The dump's statistics stay as they were:
    token rows are compared from the tensors.
    """
    import numpy

    path = tensor_file(dump, module, io)
    values = numpy.load(path)
    token_rows = values[0] if values.ndim == 3 else values
    token_rows[rows[0] : rows[1]] *= factor
    numpy.save(path, values)
