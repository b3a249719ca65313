"""The MoE routers' choices compared per token and layer: which experts each side sent each token to.

A Mixture-of-Experts layer computes another function for a token once its router picks other experts, so
a routing flip explains everything after it; the numeric comparison alone shows it only as "the router's
logits diverge". Per pair and MoE layer (a layer with a ``router`` rule in the name map):

* **training side**: the router's expert ids, from a tensor-mode dump (HF's ``Qwen3MoeTopKRouter`` returns
  ``(logits, weights, ids)``: the integer output; statistics hold only their max and min, so a statistics
  dump says so and compares no routing), and its logits (output 0), for the margins;
* **inference side**: what the engine chose, from ``routed_experts.jsonl`` (``MSPROBE_HOOKS_ROUTING=1``,
  :mod:`msprobe_hooks.inference.routed_experts`: vLLM's own router capture), else from a tensor-mode dump of
  an engine whose top-k choice is a module (SGLang's ``TopK``: its ``topk_ids``). (A level-``mix`` tensor
  dump's ``Torch.topk`` rows hold vLLM's ids too, but which call is which layer's is not said there: not read.)

A token **flips** when its *set* of top-k experts differs. A flip is **within noise** when the training
logits' top-k margin at that token (the k-th largest logit minus the next) is at most
``2 * eps * max|logit|`` of that token, ``eps`` being the larger of the step rule's floor for the router
output's dtypes (:meth:`.verdict.StepRule.floor`: fp32 1e-4, bf16 1.6e-2) and the relative error the
numeric comparison measured at the router's input: the two experts at the edge are then closer than what
rounding moves a logit by (each by up to ``eps * max|logit|``), so rounding alone can swap them. Those flips
are reported, never blamed; unless the router's own output already diverges numerically (steps up, or
crosses the threshold): its logits then differ by more than rounding, and every flip of that layer counts.
The first layer with a flip beyond the noise is where routing diverges; when it comes at or before the
pair's first numeric divergence (the router's own logits diverging *is* that layer's routing), it becomes
the pair's first divergence: "routing diverges at layer k".
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from msprobe_hooks import jsonl
from msprobe_hooks.analysis import dumpfile
from msprobe_hooks.analysis.answer.verdict import StepRule
from msprobe_hooks.analysis.comparing import names
from msprobe_hooks.analysis.pairing.pairs import Pair
from msprobe_hooks.analysis.results import FirstRule, ModuleRow, PairResult, RoutingLayer, Status, Verdict
from msprobe_hooks.join_keys import ROUTED_EXPERTS_LOG

# The name map's kinds of the modules that choose experts: a router (logits, and the ids on the training side),
# an engine's top-k module after it (SGLang's TopK: its ids, in a tensor-mode dump).
CHOOSERS = ("router", "topk")
STATISTICS_ONLY = (
    "the training dump holds statistics: a router's expert ids show only as their max and min; dump the routers "
    "in tensor mode (docs/analysis.md, 'Routing')"
)
NO_TRAINING_ROUTER = (
    "no module of the training dump is a router by the name map (a rule with compare: router): add one with "
    "--mapping (docs/analysis.md, 'The name map')"
)
NO_INFERENCE_IDS = (
    "the inference side recorded no expert ids for this step: set MSPROBE_HOOKS_ROUTING=1 "
    f"(vLLM: {ROUTED_EXPERTS_LOG} beside the dispatch log), or dump it in tensor mode (SGLang: its TopK module)"
)


@dataclass
class _Choice:
    """One router call on one side: its expert ids ``[T, k]`` (a tensor), and the training side's logits."""

    ids: Any
    source: str
    logits: Any = None


def _router_layers(rows: Sequence[ModuleRow], table: names.NameMap) -> dict[int, str]:
    """The MoE layers of a pair's rows: layer -> the router's canonical module."""
    found: dict[int, str] = {}
    for row in rows:
        if row.module and row.layer is not None and row.layer not in found:
            rule = table.lookup(row.module.split("#")[0], "")
            if rule is not None and rule[0].compare == "router":
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


def training_choices(dump: str, routers: Sequence[RouterEntry]) -> tuple[dict[int, _Choice], str | None]:
    """Per MoE layer the training router's ids and logits (``routers``: the dump's); or why there are none (a
    statistics dump)."""
    choices: dict[int, _Choice] = {}
    for layer, raw, entry in routers:
        outputs = _outputs(entry)
        label, ids = next(((k, o) for k, o in outputs if _is_int(o)), ("", None))
        loaded = _load(dump, ids) if ids else None
        if loaded is None:
            continue
        logits = _load(dump, outputs[0][1]) if not _is_int(outputs[0][1]) else None
        choices[layer] = _Choice(loaded.reshape(-1, loaded.shape[-1]), f"{raw}.{label}", logits)
    if not routers:
        return choices, NO_TRAINING_ROUTER
    if not choices:
        return choices, STATISTICS_ONLY
    return choices, None


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


def inference_choices(pair: Pair, routers: Sequence[RouterEntry]) -> dict[int, _Choice]:
    """Per MoE layer the ids the inference engine chose in the pair's step: its ``routed_experts.jsonl``, else the
    ids its tensor-mode dump holds (SGLang's TopK output; ``routers``: the dump's)."""
    import torch

    path = pair.generate.routed_experts_log
    if path is not None and os.path.isfile(path):
        for _, record in jsonl.records(path):
            if record.get("step") != pair.generate.step:
                continue
            if pair.generate.rank is not None and record.get("rank") not in (None, pair.generate.rank):
                continue
            source = f"{ROUTED_EXPERTS_LOG} step {record['step']}"
            return {
                int(layer): _Choice(torch.tensor(ids, dtype=torch.long).reshape(len(ids), -1), source)
                for layer, ids in record.get("layers", {}).items()
                if ids
            }
    return dumped_choices(pair.generate.dump, routers)


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


def _row(rows: Sequence[ModuleRow], module: str, io: str) -> ModuleRow | None:
    return next((r for r in rows if r.module == module and r.io == io), None)


def compare_layer(
    layer: int, train: _Choice, generate: _Choice, pair: Pair, rows: Sequence[ModuleRow], module: str
) -> RoutingLayer:
    """One layer: the tokens whose expert set differs, and which of those are within the logits' noise."""
    out = RoutingLayer(layer=layer, train_source=train.source, generate_source=generate.source)
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
    output, given = _row(rows, module, "output"), _row(rows, module, "input")
    eps = StepRule().floor(output) if output is not None else StepRule().minimum
    if given is not None and given.error is not None:
        eps = max(eps, given.error)
    out.noise = eps
    within = flipped & False
    # Logits that the numeric comparison already found diverging (the router's output steps up, or crosses the
    # threshold) differ by more than rounding: none of that layer's flips is noise, whatever its margin.
    router_diverges = output is not None and bool(output.steps_up or output.diverges)
    if train.logits is not None and not router_diverges:
        logits = _rows(train.logits.reshape(-1, train.logits.shape[-1]).float(), t_rows)
        if logits.shape[0] == t_ids.shape[0] and logits.shape[-1] > out.top_k:
            ordered = logits.sort(dim=-1, descending=True).values
            margin = ordered[:, out.top_k - 1] - ordered[:, out.top_k]
            within = flipped & (margin <= 2 * eps * logits.abs().max(dim=-1).values)
            if out.flipped:
                out.margin_min = float(margin[flipped].min())
    out.within_noise = int(within.sum())
    out.beyond_noise = out.flipped - out.within_noise
    return out


def judge(
    result: PairResult,
    pair: Pair,
    rows: Sequence[ModuleRow],
    table: names.NameMap,
    train_routers: Sequence[RouterEntry],
    generate_routers: Sequence[RouterEntry],
) -> None:
    """Compare the routers' choices of a pair (``result.routing``) and, when routing diverges at or before the
    first numeric divergence, make it the pair's first divergence. Nothing happens for a dense model.

    ``train_routers``, ``generate_routers``: each side's router entries, kept by compare's one pass over its dump."""
    routers = _router_layers(rows, table)
    if not routers or result.verdict in (Verdict.FAILED, Verdict.STATISTICS):
        return
    train, why = training_choices(pair.train.dump, train_routers)
    generate = inference_choices(pair, generate_routers) if not why else {}
    layers = []
    for layer in sorted(routers):
        reason = why or (NO_INFERENCE_IDS if layer not in generate else None)
        if reason is None and layer not in train:
            reason = "the training dump holds no expert ids for this layer's router (its tensor file is missing)"
        if reason is not None:
            layers.append(RoutingLayer(pair=result.pair, layer=layer, status=Status.NOT_COMPARABLE, reason=reason))
            continue
        found = compare_layer(layer, train[layer], generate[layer], pair, rows, routers[layer])
        found.pair = result.pair
        layers.append(found)
    result.routing = layers
    compared = [r for r in layers if r.status is Status.COMPARED]
    if not compared:
        return
    result.routing_layers = len(compared)
    result.routing_flipped = sum(r.flipped for r in compared)
    first = next((r for r in compared if r.beyond_noise), None)
    noisy = {r.layer: r for r in compared if r.flipped and not r.beyond_noise}
    if result.verdict is Verdict.DIVERGES and (first is None or first.layer > (_layer_of(result) or 0)):
        layer = _layer_of(result)
        router_output = _row(rows, routers.get(layer, ""), "output") if layer in noisy else None
        if router_output is not None and result.first_order is not None and result.first_order >= router_output.order:
            result.routing_noise_layer = layer  # the block's output moved for tokens rounding sent elsewhere
    if first is None:
        return
    result.routing_layer, result.routing_share = first.layer, first.share
    router_output = _row(rows, routers[first.layer], "output")
    position = router_output.order if router_output is not None else None
    if position is None or (result.first_order is not None and result.first_order < position):
        return  # a numeric divergence before the router: routing is its consequence
    if result.verdict is Verdict.DIVERGES:
        result.numeric_first = f"{result.first_module} {result.first_io}"
    result.verdict, result.first_rule = Verdict.DIVERGES, FirstRule.ROUTING
    result.first_module, result.first_io = routers[first.layer], "routing"
    result.first_error, result.first_order = first.share, position
    result.first_train_name, result.first_generate_name = first.train_source or "", first.generate_source or ""


def _layer_of(result: PairResult) -> int | None:
    parts = (result.first_module or "").split(".")
    return int(parts[1]) if len(parts) > 1 and parts[0] == "layers" and parts[1].isdigit() else None
