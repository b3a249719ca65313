"""Comparing one pair of dumps module by module (``msprobe-hooks compare``; docs/analysis.md).

Each pair of ``dump.json`` files (one training forward, one inference prefill of the same prompt)
is compared module by module through the name map of :mod:`names`: statistics mode compares the
relative error of max, min and norm (fused outputs combined exactly from their parts), tensor
mode loads the ``.pt``/``.npy`` files one tensor at a time and compares cosine, max abs error and
the relative error ``||a - b|| / ||b||``. Comparing measures only: the verdict is the answer stage's
(:func:`msprobe_hooks.analysis.answer.verdict.judge`, by the rules it is handed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from msprobe_hooks.analysis import dumpfile
from msprobe_hooks.analysis.comparing import facts, names, routing
from msprobe_hooks.analysis.comparing.shards import ShardError, Sharding, whole_stats, whole_tensor
from msprobe_hooks.analysis.comparing.side_tensors import (
    DumpedNames,
    KeptTensors,
    NotComparable,
    SideTensor,
    SideTensors,
)
from msprobe_hooks.analysis.comparing.statistics import (
    Stats,
    flat_shape,
    fuse,
    statistic_errors,
    tensor_errors,
    thresholded_error,
)
from msprobe_hooks.analysis.pairing.pairs import Pair
from msprobe_hooks.analysis.results import EntryKind, Mode, ModuleRow, PairKind, PairResult, Status, Verdict


@dataclass
class Side:
    """What one ``dump.json`` holds, keyed for comparison."""

    path: str
    task: str
    tensors: SideTensors[tuple[str, str, int]]
    not_comparable: NotComparable  # tensors with a reason instead of a key
    api_rows: int
    tokens: int | None = None  # the token rows its forward held (its embedding input's element count)
    layer_offset: int = 0  # a pipeline stage's dump: its first layer is the model's layer layer_offset
    rows: tuple[int, int] | None = None  # the rows a pair compares, [start, stop); None: all
    shards: dict[int, Side] | None = None  # a TP engine's prefill: every rank's dump (this one among them)
    routers: list[routing.RouterEntry] = field(default_factory=list)  # its MoE routers' entries, for routing


def read_side(path: str, table: names.NameMap, layer_offset: int = 0) -> Side:
    """Map every tensor of ``path``, reading its entries one at a time (the tree is never held whole).

    ``layer_offset``: the dump is a pipeline stage's, its layer 0 the model's layer ``layer_offset``."""
    meta: dict[str, Any] = {}
    dumped = DumpedNames()
    kept = KeptTensors(dumped)  # only the statistics are kept, not msprobe's entries
    tensors: SideTensors[tuple[str, str, int]] = SideTensors(kept)
    last_layer: SideTensors[int] = SideTensors(kept)  # call -> the last decoder layer's output, filed once known
    skipped = NotComparable(dumped)
    routers: list[routing.RouterEntry] = []
    api_rows = 0
    layers: list[int] = []
    position = -1
    for raw, entry, is_entry in dumpfile.entries(path):
        if not is_entry:
            meta[raw] = entry
            continue
        position += 1
        row_kind = names.kind(raw)
        if row_kind is EntryKind.API:
            api_rows += 1
            continue
        # A pipeline stage's layers under the model's numbers: its first layer's input is then the stream
        # out of the layer before it, as on the inference side.
        name = (
            names.parse(names.shift_layers(raw, layer_offset) if layer_offset else raw)
            if row_kind is EntryKind.MODULE
            else None
        )
        if name is None or not isinstance(entry, dict):  # backward rows (DUMP_PHASE=all): not a prefill
            continue
        own = names.parse(raw) if layer_offset else name  # routing numbers a stage's routers by its own layers
        chooser = routing.chooser_layer(own, table) if own is not None else None
        if chooser is not None:
            routers.append((chooser, raw, entry))
        if name.layer is not None:
            layers.append(name.layer)
        at = dumped.add(raw)
        for mapped in names.map_entry(name, entry, table):
            order = 2 * position + (1 if mapped.label.startswith("output") else 0)
            reason = mapped.reason
            index = kept.add(at, mapped.label, order, mapped.part, mapped.tensor) if not reason else -1
            for alias, (module, io) in enumerate(mapped.keys if not reason else ()):
                if not tensors.file((module, io, name.call), index, alias > 0) and not alias:
                    first = tensors[(module, io, name.call)].name
                    reason = f"a second tensor for the same key ({module} {io}; first: {first})"
            if mapped.last_layer_output and not mapped.reason:
                last_layer.file(name.call, index, True)
            if reason:
                layer = names.layer_of(table.canonical(name)[0])
                skipped.add(order, layer, at, mapped.label, reason, _shape_text(mapped.tensor.get("shape") or ()))
    if layers:  # a model without decoder layers has no last layer's output to compare
        for call, held in last_layer.items():
            tensors.file_as((f"layers.{max(layers)}", "output", call), held)
    embedding = tensors.get(("embed_tokens", "input", 0))
    tokens = embedding.in_order()[0][1].numel if embedding else None
    return Side(
        path, str(meta.get("task", "")), tensors, skipped, api_rows, tokens, layer_offset=layer_offset, routers=routers
    )


def _tensor_file(side: Side, data_name: str | None) -> str | None:
    return dumpfile.tensor_file(side.path, data_name)


_load = dumpfile.load_tensor  # loaded only when compared


def _fused_tensor(side: Side, held: SideTensor) -> Any:
    """The tensor of a key (the parts concatenated along the last dimension); None without files."""
    files = [_tensor_file(side, data_name) for _, _, data_name in held.in_order()]
    if any(f is None for f in files):
        return None
    loaded = [_load(f) for f in files]
    if len(loaded) == 1:
        return loaded[0]
    import torch

    return torch.cat([t.reshape(flat_shape(tuple(t.shape))) for t in loaded], dim=-1)


def _cut(tensor: Any, tokens: int | None, rows: tuple[int, int]) -> Any:
    """Rows ``[start, stop)`` of ``tensor``'s token dimension, flattened per row; None without one.

    The token dimension is the first of ``tokens`` elements, after a leading batch of one (HF's
    ``[1, T, ...]``; vLLM's ``[T, ...]``; Megatron's ``[s, b, h]``).
    """
    shape = tuple(tensor.shape)
    first = 1 if len(shape) > 1 and shape[0] == 1 and tokens != 1 else 0
    dims = [d for d in range(first, len(shape)) if shape[d] == tokens]
    if tokens is None or not dims or rows[1] > tokens:
        return None
    return tensor.movedim(dims[0], 0).reshape(tokens, -1)[rows[0] : rows[1]]


def _stats(held: SideTensor, module: str, table: names.NameMap) -> tuple[Stats | None, str | None]:
    """The statistics of a key, fused parts combined; or why there are none."""
    parts = [stats for _, stats, _ in held.in_order()]
    expected = table.parts_of(module) if None not in held.parts else None
    if expected and len(parts) != expected:
        return None, f"{len(parts)} of the {expected} fused parts dumped"
    return (fuse(parts) if len(parts) > 1 else parts[0]), None


@dataclass
class _Whole:
    """A tensor a TP engine split across its ranks, made whole from every rank's shard (:mod:`shards`)."""

    stats: Stats
    name: str
    sharding: Sharding
    shards: list[tuple[Side, SideTensor]]  # in rank order


def _made_whole(generate: Side, key: tuple[str, str, int], table: names.NameMap) -> tuple[_Whole | None, str | None]:
    """The whole of an inference tensor split by tensor parallelism, or why it cannot be made (None, None:
    the rule table says the tensor is not split)."""
    module, io, _ = key
    sharding = table.sharding(module, io)
    if sharding is None:
        return None, None
    if not generate.shards:
        return None, (
            "a tensor-parallel shard, and the pair names no other rank's dump: dump every rank (msprobe config "
            '"rank": []) and align again'
        )
    held: list[tuple[Side, SideTensor]] = []
    stats: list[Stats] = []
    for rank, side in sorted(generate.shards.items()):
        tensor = side.tensors.get(key)
        found, why = _stats(tensor, module, table) if tensor is not None else (None, "not dumped")
        if found is None:
            return None, f"a tensor-parallel shard; rank {rank}'s: {why}"
        held.append((side, tensor))
        stats.append(found)
    try:
        whole = whole_stats(stats, sharding.dim)
    except ShardError as exc:
        return None, f"tensor-parallel shards that do not make one tensor: {exc}"
    ranks = "+".join(str(rank) for rank in sorted(generate.shards))
    return _Whole(whole, f"{held[0][1].name} (ranks {ranks} made whole)", sharding, held), None


def _whole_tensor(whole: _Whole, train: SideTensor) -> Any:
    """The whole tensor of a :class:`_Whole` (None without files; ShardError when the slices do not fit)."""
    loaded = [_fused_tensor(side, held) for side, held in whole.shards]
    if any(t is None for t in loaded):
        return None
    sizes: list[int] = []
    if whole.sharding.parts > 1:  # [q_r | k_r | v_r] per rank: the whole's parts, from the training side's parts
        parts = train.in_order()
        if len(parts) != whole.sharding.parts or whole.sharding.dim != -1:
            raise ShardError("the training side's parts do not give the sizes of each rank's parts")
        sizes = [flat_shape(stats.shape)[-1] for _, stats, _ in parts]
        loaded = [t.reshape(flat_shape(tuple(t.shape))) for t in loaded]
    return whole_tensor(loaded, whole.sharding.dim, sizes)


def _shape_text(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape))


def _joined(train: Side, generate: Side) -> tuple[list[tuple[Any, ...]], int]:
    """Both sides' keys (an outer join of two dicts: no DataFrame needed), in the training model's order,
    inference-only keys after it: ``(key, train tensor or None, inference tensor or None, order)``."""
    both = [(k, t, generate.tensors.get(k)) for k, t in train.tensors.items()]
    end = 2 * (max((t.order for _, t, _ in both), default=0) + 1)
    only = [(k, None, g) for k, g in generate.tensors.items() if k not in train.tensors]
    joined = [(k, t, g, t.order if t is not None else end + g.order) for k, t, g in both + only]
    joined.sort(key=lambda item: (item[3], item[0]))
    return joined, end


def compare_sides(train: Side, generate: Side, table: names.NameMap) -> list[ModuleRow]:
    """One row per tensor of either side, in the training model's order (inference-only rows last), with its
    errors; whether a row diverges is the answer stage's to say."""
    rows: list[ModuleRow] = []
    joined, end = _joined(train, generate)
    stage_start = _stage_start(generate, train.layer_offset)
    for (module, io, call), t_held, g_held, order in joined:
        row = ModuleRow(
            pair=None,
            order=order,
            module=module if call == 0 else f"{module}#{call}",
            io=io,
            layer=names.layer_of(module),
            train_name=t_held.name if t_held else "",
            generate_name=g_held.name if g_held else "",
        )
        rows.append(row)
        earlier = g_held is not None and (g_held.order < stage_start or (row.layer or 0) < train.layer_offset)
        if t_held is None and earlier:  # the stream out of an earlier stage's last layer too
            row.status = Status.NOT_COMPARABLE
            row.reason = (
                f"on an earlier pipeline stage (the training dump is the stage from layer {train.layer_offset})"
            )
            continue
        if t_held is None or g_held is None:
            row.status = Status.UNMATCHED
            row.reason = f"no counterpart on the {'inference' if g_held is None else 'training'} side"
            continue
        (t_stats, t_why), (g_stats, g_why) = _stats(t_held, module, table), _stats(g_held, module, table)
        row.train_shape = _shape_text(t_stats.shape) if t_stats else ""
        row.generate_shape = _shape_text(g_stats.shape) if g_stats else ""
        row.train_dtype = t_stats.dtype if t_stats else ""
        row.generate_dtype = g_stats.dtype if g_stats else ""
        why = t_why or g_why
        if not why and (train.rows or generate.rows):
            _compare_rows(row, train, t_held, generate, g_held)
            continue
        whole = None
        if not why and t_stats.numel != g_stats.numel:
            # An inference slice of a whole training tensor: made whole from every rank (a training slice of a
            # whole inference tensor, Megatron TP against a TP 1 engine, is not).
            if g_stats.numel < t_stats.numel:
                whole, why = _made_whole(generate, (module, io, call), table)
            if whole is not None and whole.stats.numel == t_stats.numel:
                g_stats, row.generate_name = whole.stats, whole.name
                row.generate_shape, row.generate_dtype = _shape_text(g_stats.shape), g_stats.dtype
            elif whole is not None:
                why = (
                    f"tensor-parallel shards made whole hold {whole.stats.numel} elements, the training side "
                    f"{t_stats.numel}: KV heads copied onto several ranks (TP > KV heads)?"
                )
                whole = None
            elif why is None:
                why = (
                    f"shapes differ ({row.train_shape} vs {row.generate_shape}): "
                    "sharded differently by tensor parallelism?"
                )
        if why:
            row.status, row.reason = Status.NOT_COMPARABLE, why
            continue
        errors = statistic_errors(t_stats, g_stats)
        row.max_rel, row.min_rel, row.norm_rel, row.mean_rel = (errors[s] for s in ("max", "min", "norm", "mean"))
        row.error = thresholded_error(errors)
        t_tensor = _fused_tensor(train, t_held) if Mode.TENSOR in (train.task, generate.task) else None
        g_tensor = None
        if t_tensor is not None:
            try:
                g_tensor = _whole_tensor(whole, t_held) if whole is not None else _fused_tensor(generate, g_held)
            except ShardError:
                g_tensor = None  # compared on its statistics, as a tensor whose file is missing
        if g_tensor is not None:
            metrics = tensor_errors(t_tensor, g_tensor)
            row.cosine, row.max_abs, row.tensor_rel = metrics["cosine"], metrics["max_abs"], metrics["relative"]
            row.error = metrics["relative"]
        del t_tensor, g_tensor  # one tensor pair in memory at a time
        if row.error is None:
            row.status, row.reason = Status.NOT_COMPARABLE, "no statistics dumped (empty or non-float tensor)"
        else:
            row.status = Status.COMPARED
    rows.extend(train.not_comparable.rows(0, inference=False))
    rows.extend(generate.not_comparable.rows(end, inference=True))
    rows.sort(key=lambda r: r.order)  # stable: keys of one tensor keep their sorted order
    return rows


def _stage_start(generate: Side, layer_offset: int) -> int:
    """The inference side's order from which a training stage starting at ``layer_offset`` computes (0: all)."""
    if not layer_offset:
        return 0
    orders = [g.order for (m, _, _), g in generate.tensors.items() if (names.layer_of(m) or -1) >= layer_offset]
    return min(orders, default=0)


def _compare_rows(row: ModuleRow, train: Side, t_held: SideTensor, generate: Side, g_held: SideTensor) -> None:
    """One token's rows (a decode pair, or a prompt's rows of a sequence) of a key, element by element."""
    t_tensor, g_tensor = _fused_tensor(train, t_held), _fused_tensor(generate, g_held)
    if t_tensor is None or g_tensor is None:
        row.status, row.reason = Status.NOT_COMPARABLE, "tensor file missing: a token's rows are cut from tensors"
        return
    whole = (0, train.tokens or 0), (0, generate.tokens or 0)
    t_rows = _cut(t_tensor, train.tokens, train.rows or whole[0])
    g_rows = _cut(g_tensor, generate.tokens, generate.rows or whole[1])
    del t_tensor, g_tensor
    if t_rows is None or g_rows is None:
        row.status, row.reason = Status.NOT_COMPARABLE, "no token dimension (not an activation of the tokens)"
        return
    row.train_shape, row.generate_shape = _shape_text(t_rows.shape), _shape_text(g_rows.shape)
    if t_rows.numel() != g_rows.numel():
        why = f"shapes differ ({row.train_shape} vs {row.generate_shape}): sharded differently by tensor parallelism?"
        row.status, row.reason = Status.NOT_COMPARABLE, why
        return
    metrics = tensor_errors(t_rows, g_rows)
    row.cosine, row.max_abs, row.tensor_rel = metrics["cosine"], metrics["max_abs"], metrics["relative"]
    row.error = metrics["relative"]
    row.status = Status.COMPARED


def compare_pair(index: int, pair: Pair, mapping: str | None = None) -> tuple[PairResult, list[ModuleRow]]:
    """One pair's rows and what they measure (no verdict yet: :func:`.answer.verdict.judge` decides it); a dump
    that cannot be read fails this pair only, a token's rows that cannot be cut from statistics too.

    ``mapping`` is a user's name-map file (``compare --mapping``), read once per process.
    """
    result = PairResult(
        pair=pair.pair if pair.pair is not None else index,
        rule=pair.rule,
        key=pair.key,
        train_dump=pair.train.dump,
        generate_dump=pair.generate.dump,
        kind=PairKind(pair.kind),
        position=pair.position,
        token_index=pair.token_index,
        global_step=pair.train.global_step,
    )
    table = names.load(mapping)
    try:
        train = read_side(pair.train.dump, table, pair.train.layer_offset or 0)
        generate = read_side(pair.generate.dump, table)
        if pair.generate.shards:  # a TP engine: every rank's dump of the prefill (this one read already)
            generate.shards = {
                shard.rank if shard.rank is not None else -1: (
                    generate if shard.dump == pair.generate.dump else read_side(shard.dump, table)
                )
                for shard in pair.generate.shards
            }
    except (OSError, ValueError) as exc:
        result.verdict, result.message = Verdict.FAILED, f"cannot read a dump: {exc}"
        return result, []
    train.rows = tuple(pair.train.rows) if pair.train.rows else None
    generate.rows = tuple(pair.generate.rows) if pair.generate.rows else None
    if (train.rows or generate.rows) and not train.task == generate.task == Mode.TENSOR:
        result.verdict = Verdict.STATISTICS
        if pair.kind == PairKind.DECODE:
            cut = "a decode pair compares one token's rows"
        else:
            cut = (
                f"the training forward holds more rows than the prompt's {pair.prompt_len} (a packed micro-batch, "
                "or a prompt Megatron padded to a multiple of TP x CP)"
            )
        result.message = (
            f"{cut}; statistics dumps hold whole tensors' statistics, from which no row can be cut: dump that "
            "step in tensor mode (docs/analysis.md)"
        )
        return result, []
    rows = compare_sides(train, generate, table)
    for row in rows:
        row.pair = result.pair
    compared = [r for r in rows if r.status is Status.COMPARED]
    worst = max(compared, key=lambda r: r.error, default=None)
    result.mode = Mode.TENSOR if any(r.cosine is not None for r in compared) else Mode.STATISTICS
    result.compared = len(compared)
    result.unmatched = sum(r.status is Status.UNMATCHED for r in rows)
    result.not_comparable = sum(r.status is Status.NOT_COMPARABLE for r in rows)
    result.api_rows = f"{train.api_rows}/{generate.api_rows}"
    result.row_facts = facts.of_rows(rows)
    if worst is not None:
        result.max_error, result.max_module = worst.error, f"{worst.module} {worst.io}"
    # MoE pairs: the routers' choices; nothing for a dense model
    routing.compare(result, pair, rows, table, train.routers, generate.routers)
    return result, rows
