"""The MoE routers' choices compared per token and layer: which experts each side sent each token to.

A Mixture-of-Experts layer computes another function for a token once its router picks other experts, so
a routing flip explains everything after it; the numeric comparison alone shows it only as "the router's
logits diverge". Per pair and MoE layer (a layer with a ``router`` rule in the name map):

* **training side**: the router's expert ids, from a tensor-mode dump (HF's ``Qwen3MoeTopKRouter`` returns
  ``(logits, weights, ids)``: the integer output) and its logits (output 0), for the margins; else (statistics
  hold only the ids' max and min) from its process's ``routed_experts.jsonl``, written beside every dumped window
  (:mod:`msprobe_hooks.training.routed_experts`: the ids and each token's margin);
* **inference side**: what the engine chose, from ``routed_experts.jsonl`` (written for every dumped step, or every
  step with ``MSPROBE_HOOKS_ROUTING=1``; :mod:`msprobe_hooks.inference.routed_experts`: vLLM's own router capture,
  SGLang's ``TopK`` modules), else from a tensor-mode dump of an engine whose top-k choice is a module (SGLang's
  ``TopK``: its ``topk_ids``). (A level-``mix`` tensor dump's ``Torch.topk`` rows hold vLLM's ids too, but which
  call is which layer's is not said there: not read.)

A token **flips** when its *set* of top-k experts differs. Per flipped token this module also takes the
training logits' top-k margin (the k-th largest logit minus the next) and the token's largest ``|logit|``:
whether a flip is within the logits' noise, and whether routing names the pair's first divergence, the
routing rule of the answer stage decides from them (:class:`msprobe_hooks.analysis.answer.verdict.RoutingRule`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from msprobe_hooks import jsonl
from msprobe_hooks.analysis import dumpfile
from msprobe_hooks.analysis.comparing import names
from msprobe_hooks.analysis.pairing.pairs import Pair
from msprobe_hooks.analysis.results import CompareKind, ModuleRow, PairResult, RoutingLayer, Status
from msprobe_hooks.join_keys import ROUTED_EXPERTS_LOG

# The name map's kinds of the modules that choose experts: a router (logits, and the ids on the training side),
# an engine's top-k module after it (SGLang's TopK: its ids, in a tensor-mode dump).
CHOOSERS = (CompareKind.ROUTER, CompareKind.TOPK)
STATISTICS_ONLY = (
    f"the training dump holds statistics (a router's expert ids show only as their max and min) and its process "
    f"wrote no {ROUTED_EXPERTS_LOG} line for this step (an older msprobe-hooks, or the process died first): "
    "dump the routers in tensor mode (docs/analysis.md, 'Routing')"
)
NO_TRAINING_ROUTER = (
    "no module of the training dump is a router by the name map (a rule with compare: router): add one with "
    "--mapping (docs/analysis.md, 'The name map')"
)
NO_INFERENCE_IDS = (
    f"the inference side recorded no expert ids for this step (no {ROUTED_EXPERTS_LOG} line: an older msprobe-hooks, "
    "or a dump msprobe drove itself, e.g. vLLM-Ascend's switch, which needs MSPROBE_HOOKS_ROUTING=1)"
)


@dataclass
class _Choice:
    """One router call on one side: its expert ids ``[T, k]`` (a tensor), and the training side's logits or its
    recorded margins ``[T, 2]`` (the top-k margin and the largest ``|logit|`` of each token)."""

    ids: Any
    source: str
    logits: Any = None
    margins: Any = None


def _router_layers(rows: Sequence[ModuleRow], table: names.NameMap) -> dict[int, str]:
    """The MoE layers of a pair's rows: layer -> the router's canonical module."""
    found: dict[int, str] = {}
    for row in rows:
        if row.module and row.layer is not None and row.layer not in found:
            rule = table.lookup(row.module.split("#")[0], "")
            if rule is not None and rule[0].compare is CompareKind.ROUTER:
                found[row.layer] = row.module
    return found


# A router's or top-k module's entry of a dump: (layer, its dumped name, msprobe's entry).
RouterEntry = tuple[int, str, dict]


def chooser_layer(name: names.ModuleName, table: names.NameMap) -> int | None:
    """The layer of a module entry when it is the first call of a module that chooses experts; else None.

    ``compare``'s one pass over a dump keeps those entries (:attr:`.compare.Side.routers`): routing reads them
    there, not from the dump again."""
    if name.call != 0:
        return None
    found = table.lookup(name.path, name.cls)
    return found[2] if found is not None and found[0].compare in CHOOSERS else None


def _outputs(entry: dict) -> list[tuple[str, dict]]:
    """An entry's outputs, labelled as msprobe names them: a tuple's items (``output.2``), or a named output's
    fields (SGLang's TopK: ``output.topk_ids``)."""
    output = entry.get("output")
    if isinstance(output, dict) and output.get("type") != "torch.Tensor":
        return [(f"output.{k}", v if isinstance(v, dict) else {}) for k, v in output.items()]
    output = [output] if isinstance(output, dict) else output or []
    return [(f"output.{i}", o if isinstance(o, dict) else {}) for i, o in enumerate(output)]


def _is_int(tensor: dict) -> bool:
    return "int" in str(tensor.get("dtype", ""))


def _load(dump: str, tensor: dict) -> Any:
    path = dumpfile.tensor_file(dump, tensor.get("data_name"))
    return dumpfile.load_tensor(path) if path else None


def training_choices(pair: Pair, routers: Sequence[RouterEntry]) -> tuple[dict[int, _Choice], str | None]:
    """Per MoE layer the training router's ids and logits (``routers``: the dump's), else the ids and margins its
    process recorded for the pair's step; or why there are none."""
    if not routers:
        return {}, NO_TRAINING_ROUTER
    choices = _tensor_choices(pair.train.dump, routers)
    if not choices:
        choices = _logged_choices(pair.train.routed_experts_log, pair.train.step, pair.train.rank)
    return choices, None if choices else STATISTICS_ONLY


def _tensor_choices(dump: str, routers: Sequence[RouterEntry]) -> dict[int, _Choice]:
    """Per MoE layer the training router's ids and logits a tensor-mode dump holds."""
    choices: dict[int, _Choice] = {}
    for layer, raw, entry in routers:
        outputs = _outputs(entry)
        label, ids = next(((k, o) for k, o in outputs if _is_int(o)), ("", None))
        loaded = _load(dump, ids) if ids else None
        if loaded is None:
            continue
        logits = _load(dump, outputs[0][1]) if not _is_int(outputs[0][1]) else None
        choices[layer] = _Choice(loaded.reshape(-1, loaded.shape[-1]), f"{raw}.{label}", logits)
    return choices


def _logged_choices(path: str | None, step: int | None, rank: int | None) -> dict[int, _Choice]:
    """Per MoE layer the ids (and margins, where written) of a ``routed_experts.jsonl`` line of ``step``."""
    import torch

    if path is None or not os.path.isfile(path):
        return {}
    for _, record in jsonl.records(path):
        if record.get("step") != step or (rank is not None and record.get("rank") not in (None, rank)):
            continue
        source = f"{ROUTED_EXPERTS_LOG} step {record['step']}"
        margins = record.get("margins") or {}
        return {
            int(layer): _Choice(
                torch.tensor(ids, dtype=torch.long).reshape(len(ids), -1),
                source,
                margins=torch.tensor(margins[layer], dtype=torch.float64) if margins.get(layer) else None,
            )
            for layer, ids in record.get("layers", {}).items()
            if ids
        }
    return {}


def dumped_choices(dump: str, routers: Sequence[RouterEntry]) -> dict[int, _Choice]:
    """Per MoE layer the expert ids a tensor-mode dump holds: the integer output of its router or top-k module
    (``routers``: the dump's)."""
    choices: dict[int, _Choice] = {}
    for layer, raw, entry in routers:
        label, ids = next(((k, o) for k, o in _outputs(entry) if _is_int(o)), ("", None))
        loaded = _load(dump, ids) if ids and layer not in choices else None
        if loaded is not None:
            choices[layer] = _Choice(loaded.reshape(-1, loaded.shape[-1]), f"{raw}.{label}")
    return choices


def generate_choices(pair: Pair, routers: Sequence[RouterEntry]) -> dict[int, _Choice]:
    """Per MoE layer the ids the inference engine chose in the pair's step: its ``routed_experts.jsonl``, else the
    ids its tensor-mode dump holds (SGLang's TopK output; ``routers``: the dump's)."""
    logged = _logged_choices(pair.generate.routed_experts_log, pair.generate.step, pair.generate.rank)
    return logged or dumped_choices(pair.generate.dump, routers)


def _rows(tensor: Any, rows: tuple[int, int] | None) -> Any:
    return tensor if rows is None else tensor[rows[0] : rows[1]]


def _generate_rows(pair: Pair, held: int) -> tuple[int, int] | None:
    """The pair's rows of the inference step's ids: a decode pair's, or a packed step's request's."""
    if pair.generate.rows:
        return (pair.generate.rows[0], pair.generate.rows[1])
    offset, tokens = pair.generate.offset, pair.generate.tokens
    if offset is not None and tokens is not None and held > tokens:
        return (offset, offset + tokens)
    return None


def compare_layer(layer: int, train: _Choice, generate: _Choice, pair: Pair, module: str) -> RoutingLayer:
    """One layer: the tokens whose expert set differs, and the training margins of those tokens."""
    out = RoutingLayer(layer=layer, train_source=train.source, generate_source=generate.source, router=module)
    t_rows = (pair.train.rows[0], pair.train.rows[1]) if pair.train.rows else None
    t_ids = _rows(train.ids, t_rows)
    g_ids = _rows(generate.ids, _generate_rows(pair, generate.ids.shape[0]))
    if tuple(t_ids.shape) != tuple(g_ids.shape):
        out.status = Status.NOT_COMPARABLE
        out.reason = f"expert ids of shape {list(t_ids.shape)} (training) against {list(g_ids.shape)} (inference)"
        return out
    flipped = (t_ids.sort(dim=-1).values != g_ids.sort(dim=-1).values).any(dim=-1)
    out.status, out.tokens, out.top_k = Status.COMPARED, int(t_ids.shape[0]), int(t_ids.shape[-1])
    out.flipped = int(flipped.sum())
    out.share = out.flipped / out.tokens if out.tokens else 0.0
    if train.logits is not None:
        logits = _rows(train.logits.reshape(-1, train.logits.shape[-1]).float(), t_rows)
        if logits.shape[0] == t_ids.shape[0] and logits.shape[-1] > out.top_k:
            ordered = logits.sort(dim=-1, descending=True).values
            margin = ordered[:, out.top_k - 1] - ordered[:, out.top_k]
            largest = logits.abs().max(dim=-1).values
            out.margins = list(zip(margin[flipped].tolist(), largest[flipped].tolist(), strict=True))
    elif train.margins is not None:
        recorded = _rows(train.margins, t_rows)
        if recorded.shape[0] == t_ids.shape[0]:
            out.margins = [(margin, largest) for margin, largest in recorded[flipped].tolist()]
    return out


def compare(
    result: PairResult,
    pair: Pair,
    rows: Sequence[ModuleRow],
    table: names.NameMap,
    train_routers: Sequence[RouterEntry],
    generate_routers: Sequence[RouterEntry],
) -> None:
    """Compare the routers' choices of a pair, layer by layer (``result.routing``). Nothing happens for a dense
    model.

    ``train_routers``, ``generate_routers``: each side's router entries, kept by compare's one pass over its dump."""
    routers = _router_layers(rows, table)
    if not routers:
        return
    train, why = training_choices(pair, train_routers)
    generate = generate_choices(pair, generate_routers) if not why else {}
    layers = []
    for layer in sorted(routers):
        reason = why or (NO_INFERENCE_IDS if layer not in generate else None)
        if reason is None and layer not in train:
            reason = "the training dump holds no expert ids for this layer's router (its tensor file is missing)"
        if reason is not None:
            layers.append(
                RoutingLayer(
                    pair=result.pair, layer=layer, status=Status.NOT_COMPARABLE, reason=reason, router=routers[layer]
                )
            )
            continue
        found = compare_layer(layer, train[layer], generate[layer], pair, routers[layer])
        found.pair = result.pair
        layers.append(found)
    result.routing = layers
    compared = [r for r in layers if r.status is Status.COMPARED]
    if compared:
        result.routing_layers = len(compared)
        result.routing_flipped = sum(r.flipped or 0 for r in compared)  # a compared layer has its count
