"""``msprobe-hooks compare pairs.jsonl -o report/`` (DESIGN.md §6).

Each pair of ``dump.json`` files (one training forward, one inference prefill of the same prompt)
is compared module by module through the name map of :mod:`names`: statistics mode compares the
relative error of max, min and norm (fused outputs combined exactly from their parts), tensor
mode loads the ``.pt``/``.npy`` files one tensor at a time and compares cosine, max abs error and
the relative error ``||a - b|| / ||b||``. The verdict of a pair is the first compared tensor, in
the training model's order, whose error crosses the threshold; a pair where nothing could be
compared says so and is never a pass. Pairs run in a process pool (all cores by default).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from msprobe_hooks.analysis import dumpfile, names, pairs
from msprobe_hooks.analysis.statistics import (
    Stats,
    flat_shape,
    fuse,
    statistic_errors,
    tensor_errors,
    thresholded_error,
)

# Relative error of max/min/norm (tensor mode: ||a-b||/||b||) above which a tensor diverges.
# Measured (reference/train-vs-vllm-dumps.md): identical weights in fp32 <= 1.3e-6; vLLM in bf16
# against fp32 training up to 1.2e-2 (max/min), 4.3e-3 (norm); one linear's weights x1.05:
# 4.8e-2 on that linear's output. 2e-2 sits between "the same maths in another precision" and
# "changed weights"; for fp32 on both sides, --threshold 1e-4 also catches sub-percent changes.
DEFAULT_THRESHOLD = 2e-2

COMPARED, UNMATCHED, NOT_COMPARABLE = "compared", "unmatched", "not comparable"
NO_DIVERGENCE = "no divergence above threshold"
DIVERGES = "diverges"
NOTHING_COMPARED = "nothing compared"
FAILED = "failed"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pairs", help="the pairs file written by align")
    parser.add_argument("-o", "--output", default="report", help="the report folder (default report/)")
    parser.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"relative error of max/min/norm (tensor mode: ||a-b||/||b||) above which a module diverges "
        f"(default {DEFAULT_THRESHOLD:g}: above bf16-vs-fp32 noise, below a 5%% weight change; see docs/analysis.md)",
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="processes comparing pairs (default: all cores)"
    )
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the pairs as tasks on the existing Ray cluster at ADDRESS (host:port, or auto) instead of a "
        "local pool; the dumps must be readable from its nodes (shared storage)",
    )


@dataclass
class SideTensor:
    """One canonical key on one side: a tensor, or the parts of a fused one."""

    order: int
    alias: bool
    # part (None: not fused) -> (dumped name, its statistics, its tensor file's name in tensor mode)
    parts: dict[int | None, tuple[str, Stats, str | None]] = field(default_factory=dict)

    def in_order(self) -> list[tuple[str, Stats, str | None]]:
        return [part for _, part in sorted(self.parts.items(), key=lambda kv: kv[0] or 0)]

    @property
    def name(self) -> str:
        return " + ".join(name for name, _, _ in self.in_order())


@dataclass
class Side:
    """What one ``dump.json`` holds, keyed for comparison."""

    path: str
    task: str
    tensors: dict[tuple[str, str, int], SideTensor]
    not_comparable: list[dict[str, Any]]
    api_rows: int


def read_side(path: str) -> Side:
    """Map every tensor of ``path``, reading its entries one at a time (the tree is never held whole)."""
    meta: dict[str, Any] = {}
    tensors: dict[tuple[str, str, int], SideTensor] = {}
    skipped: list[dict[str, Any]] = []
    api_rows = 0
    layers: list[int] = []
    position = -1
    for raw, entry, is_entry in dumpfile.entries(path):
        if not is_entry:
            meta[raw] = entry
            continue
        position += 1
        row_kind = names.kind(raw)
        if row_kind == "api":
            api_rows += 1
            continue
        name = names.parse(raw) if row_kind == "module" else None
        if name is None or not isinstance(entry, dict):  # backward rows (DUMP_PHASE=all): not a prefill
            continue
        if name.layer is not None:
            layers.append(name.layer)
        for mapped in names.map_entry(name, entry):
            order = 2 * position + (1 if mapped.label.startswith("output") else 0)
            dumped = f"{raw}.{mapped.label}"
            if mapped.reason:
                skipped.append(
                    {
                        "order": order,
                        "name": dumped,
                        "reason": mapped.reason,
                        "shape": _shape_text(mapped.tensor.get("shape") or ()),
                    }
                )
                continue
            for index, (module, io) in enumerate(mapped.keys):
                key = (module, io, name.call)
                alias = index > 0
                held = tensors.get(key)
                if held is None or (held.alias and not alias):
                    tensors[key] = held = SideTensor(order, alias)
                elif held.alias != alias or mapped.part is None or mapped.part in held.parts:
                    if not alias:
                        skipped.append(
                            {
                                "order": order,
                                "name": dumped,
                                "reason": f"a second tensor for the same key ({module} {io}; first: {held.name})",
                                "shape": _shape_text(mapped.tensor.get("shape") or ()),
                            }
                        )
                    continue
                # Only the statistics are kept, not msprobe's entry: memory grows with tensors, not with the file.
                held.parts[mapped.part] = (dumped, Stats.from_dump(mapped.tensor), mapped.tensor.get("data_name"))
    last = f"layers.{names.LAST_LAYER}"
    if layers:
        for key in [k for k in tensors if k[0] == last]:
            tensors.setdefault((f"layers.{max(layers)}", key[1], key[2]), tensors[key])
            del tensors[key]
    return Side(path, str(meta.get("task", "")), tensors, skipped, api_rows)


def _tensor_file(side: Side, data_name: str | None) -> str | None:
    if not data_name:
        return None
    path = os.path.join(os.path.dirname(side.path), "dump_tensor_data", data_name)
    return path if os.path.isfile(path) else None


def _load(path: str) -> Any:
    """One dumped tensor (``.pt`` or ``.npy``) as a torch tensor; loaded only when compared."""
    import torch

    if path.endswith(".npy"):
        import numpy

        return torch.from_numpy(numpy.load(path))
    return torch.load(path, map_location="cpu", weights_only=True)


def _fused_tensor(side: Side, held: SideTensor) -> Any:
    """The tensor of a key (the parts concatenated along the last dimension); None without files."""
    files = [_tensor_file(side, data_name) for _, _, data_name in held.in_order()]
    if any(f is None for f in files):
        return None
    loaded = [_load(f) for f in files]  # type: ignore[arg-type]
    if len(loaded) == 1:
        return loaded[0]
    import torch

    return torch.cat([t.reshape(flat_shape(tuple(t.shape))) for t in loaded], dim=-1)


def _stats(held: SideTensor, module: str) -> tuple[Stats | None, str | None]:
    """The statistics of a key, fused parts combined; or why there are none."""
    parts = [stats for _, stats, _ in held.in_order()]
    expected = names.FUSED_PARTS.get(module.split(".", 2)[-1]) if None not in held.parts else None
    if expected and len(parts) != expected:
        return None, f"{len(parts)} of the {expected} fused parts dumped"
    return (fuse(parts) if len(parts) > 1 else parts[0]), None


def _shape_text(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape))


def compare_sides(train: Side, generate: Side, threshold: float) -> list[dict[str, Any]]:
    """One row per tensor of either side, in the training model's order (inference-only rows last)."""
    rows: list[dict[str, Any]] = []
    end = 2 * (max((t.order for t in train.tensors.values()), default=0) + 1)
    for key in sorted(set(train.tensors) | set(generate.tensors), key=lambda k: (_order(k, train, generate, end), k)):
        module, io, call = key
        t_held, g_held = train.tensors.get(key), generate.tensors.get(key)
        row: dict[str, Any] = {
            "order": _order(key, train, generate, end),
            "module": module if call == 0 else f"{module}#{call}",
            "io": io,
            "layer": _layer(module),
            "train_name": t_held.name if t_held else "",
            "generate_name": g_held.name if g_held else "",
        }
        if t_held is None or g_held is None:
            row.update(
                status=UNMATCHED, reason=f"no counterpart on the {'inference' if g_held is None else 'training'} side"
            )
            rows.append(row)
            continue
        (t_stats, t_why), (g_stats, g_why) = _stats(t_held, module), _stats(g_held, module)
        row.update(
            train_shape=_shape_text(t_stats.shape) if t_stats else "",
            generate_shape=_shape_text(g_stats.shape) if g_stats else "",
            train_dtype=t_stats.dtype if t_stats else "",
            generate_dtype=g_stats.dtype if g_stats else "",
        )
        why = t_why or g_why
        if not why and t_stats.numel != g_stats.numel:  # type: ignore[union-attr]
            shapes = f"{row['train_shape']} vs {row['generate_shape']}"
            why = f"shapes differ ({shapes}): sharded differently by tensor parallelism?"
        if why:
            row.update(status=NOT_COMPARABLE, reason=why)
            rows.append(row)
            continue
        errors = statistic_errors(t_stats, g_stats)  # type: ignore[arg-type]
        row.update({f"{name}_rel": value for name, value in errors.items()})
        row["error"] = thresholded_error(errors)
        t_tensor = _fused_tensor(train, t_held) if "tensor" in (train.task, generate.task) else None
        g_tensor = _fused_tensor(generate, g_held) if t_tensor is not None else None
        if g_tensor is not None:
            metrics = tensor_errors(t_tensor, g_tensor)
            row.update(cosine=metrics["cosine"], max_abs=metrics["max_abs"], tensor_rel=metrics["relative"])
            row["error"] = metrics["relative"]
        del t_tensor, g_tensor  # one tensor pair in memory at a time
        if row["error"] is None:
            row.update(status=NOT_COMPARABLE, reason="no statistics dumped (empty or non-float tensor)")
        else:
            row.update(status=COMPARED, diverges=row["error"] > threshold)
        rows.append(row)
    for side, label in ((train, "train_name"), (generate, "generate_name")):
        for item in side.not_comparable:
            rows.append(
                {
                    "order": item["order"] + (0 if side is train else end),
                    "module": "",
                    "io": "",
                    "layer": _layer(_module_of(item["name"])),
                    label: item["name"],
                    "status": NOT_COMPARABLE,
                    "reason": item["reason"],
                    f"{'train' if side is train else 'generate'}_shape": item["shape"],
                }
            )
    rows.sort(key=lambda r: r["order"])  # stable: keys of one tensor keep their sorted order
    return rows


def _order(key: tuple[str, str, int], train: Side, generate: Side, end: int) -> int:
    held = train.tensors.get(key)
    return held.order if held else end + generate.tensors[key].order


def _module_of(dumped: str) -> str:
    name = names.parse(dumped.split(".forward.")[0] + ".forward.0")
    return names.canonical(name)[0] if name else ""


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return int(parts[1]) if len(parts) > 1 and parts[0] == "layers" and parts[1].isdigit() else None


def compare_pair(index: int, pair: dict[str, Any], threshold: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The verdict of one pair and its rows; a dump that cannot be read fails this pair only."""
    result: dict[str, Any] = {
        "pair": pair.get("pair", index),
        "rule": pair.get("rule", ""),
        "key": pair.get("key", ""),
        "train_dump": pair["train"]["dump"],
        "generate_dump": pair["generate"]["dump"],
    }
    try:
        train = read_side(pair["train"]["dump"])
        generate = read_side(pair["generate"]["dump"])
    except (OSError, ValueError) as exc:
        result.update(verdict=FAILED, message=f"cannot read a dump: {exc}")
        return result, []
    rows = compare_sides(train, generate, threshold)
    for row in rows:
        row["pair"] = result["pair"]
    compared = [r for r in rows if r["status"] == COMPARED]
    first = next((r for r in compared if r["diverges"]), None)
    worst = max(compared, key=lambda r: r["error"], default=None)
    result.update(
        mode="tensor" if any("cosine" in r for r in compared) else "statistics",
        compared=len(compared),
        unmatched=sum(r["status"] == UNMATCHED for r in rows),
        not_comparable=sum(r["status"] == NOT_COMPARABLE for r in rows),
        api_rows=f"{train.api_rows}/{generate.api_rows}",
        verdict=DIVERGES if first else (NO_DIVERGENCE if compared else NOTHING_COMPARED),
        first_module=first["module"] if first else "",
        first_io=first["io"] if first else "",
        first_error=first["error"] if first else None,
        first_order=first["order"] if first else None,
        first_train_name=first["train_name"] if first else "",
        first_generate_name=first["generate_name"] if first else "",
        max_error=worst["error"] if worst else None,
        max_module=f"{worst['module']} {worst['io']}" if worst else "",
    )
    return result, rows


def compare_all(
    pair_list: list[dict[str, Any]], threshold: float, jobs: int
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Every pair compared, in a pool of ``jobs`` processes, results in completion order."""
    from tqdm import tqdm

    with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(pair_list) or 1))) as pool:
        futures = [pool.submit(compare_pair, i, pair, threshold) for i, pair in enumerate(pair_list)]
        for future in tqdm(as_completed(futures), total=len(futures), unit="pair", disable=None):
            yield future.result()


def compare_on_ray(
    pair_list: list[dict[str, Any]], threshold: float, address: str
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Every pair as one task on an existing Ray cluster (verl jobs run one), results in completion order."""
    import ray
    from tqdm import tqdm

    ray.init(address=address, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1)(compare_pair)
        pending = [task.remote(i, pair, threshold) for i, pair in enumerate(pair_list)]
        with tqdm(total=len(pending), unit="pair", disable=None) as bar:
            while pending:
                done, pending = ray.wait(pending)
                for ref in done:
                    bar.update()
                    yield ray.get(ref)
    finally:
        ray.shutdown()  # disconnects this driver; the cluster stays up


def run(args: argparse.Namespace) -> int:
    from msprobe_hooks.analysis import report

    if not math.isfinite(args.threshold) or args.threshold <= 0:
        print(f"msprobe-hooks compare: --threshold {args.threshold}: expected a positive number", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"msprobe-hooks compare: --jobs {args.jobs}: expected 1 or more", file=sys.stderr)
        return 2
    try:
        pair_list = list(pairs.read(args.pairs))
    except OSError as exc:
        print(f"msprobe-hooks compare: cannot read {args.pairs}: {exc.strerror}", file=sys.stderr)
        return 2
    except pairs.PairsFileError as exc:
        print(f"msprobe-hooks compare: {exc}", file=sys.stderr)
        return 2
    if not pair_list:
        print(f"msprobe-hooks compare: {args.pairs} holds no pairs (run align first)", file=sys.stderr)
        return 2
    results, rows = [], []
    if args.ray:
        outcomes = compare_on_ray(pair_list, args.threshold, args.ray)
    else:
        outcomes = compare_all(pair_list, args.threshold, args.jobs)
    try:
        for result, pair_rows in outcomes:
            results.append(result)
            rows.extend(pair_rows)
    except ImportError as exc:
        print(f"msprobe-hooks compare: --ray {args.ray}: cannot import ray ({exc}); install ray", file=sys.stderr)
        return 2
    except (ConnectionError, RuntimeError) as exc:
        if not args.ray:
            raise
        print(f"msprobe-hooks compare: --ray {args.ray}: no Ray cluster there ({exc})", file=sys.stderr)
        return 2
    written = report.write(args.output, results, rows, args.threshold)
    for line in report.summary_lines(results, args.threshold):
        print(line)
    print(f"report: {written}")
    # Not a verdict: a pair that failed or had nothing to compare is a collection problem to look at.
    return 1 if any(r["verdict"] in (FAILED, NOTHING_COMPARED) for r in results) else 0
