"""Which dumped tensor of a training engine is which dumped tensor of an inference engine.

Every ``Module.*`` entry of a ``dump.json`` is parsed into a module path (wrapper segments dropped)
and mapped to canonical keys ``(module, io)``: ``("layers.1.mlp.down_proj", "output")``. Two tensors
with the same key, one per side, are the same quantity; a tensor with no counterpart by construction
gets a reason instead of a key.

The correspondence itself is data: the rules of ``name_map.yaml`` (shipped), extended or overridden
by a user's file (``compare --mapping``). A rule names a canonical module, the dumped names it covers
and how its tensors compare (:data:`KINDS`); this module only applies them. The built-in rules are the
correspondence measured on real dumps, verl 0.9.1's FSDP2 engine against vLLM 0.32 and SGLang 0.5.21 and its Megatron
engine against vLLM: the table of docs/analysis.md ("What is compared with what"); the dumps are kept in
``tests/golden`` (its README says what each holds) and compared by ``tests/analysis/test_golden.py`` and
``test_megatron_pairs.py``. The rules' grammar is ``name_map.yaml``'s header.

Entries that are not ``Module.<path>.<Class>.forward.<n>`` (msprobe's API rows at level mix,
backward rows) are classified, never mapped.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from msprobe_hooks.analysis.comparing.shards import PARALLEL, Sharding
from msprobe_hooks.analysis.results import CompareKind, EntryKind

# Path segments that wrap a module without changing what it computes.
WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod", "module"})
API_PREFIXES = ("Functional.", "Tensor.", "Torch.", "VF.", "Distributed.", "NPU.", "Triton.", "Aten.")
BUILTIN_MAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "name_map.yaml")
# A decoder layer's segments in a module path: group 2 is its number.
_LAYER = re.compile(r"(^|\.)layers\.(\d+)(?=\.|$)")
_RULE_FIELDS = frozenset(
    {"module", "names", "parts", "compare", "reason", "stream", "also", "classes", "parallel", "shard_dim"}
)
_STREAMS = ("previous_layer", "last_layer")
# The (path, class) lookups a name map remembers: every module of a real model (a few thousand paths), not every one
# of a dump deeper than any model, whose paths would otherwise be held for the process's life.
LOOKUPS_HELD = 1 << 14


class MappingError(ValueError):
    """A name-map file (built-in or ``--mapping``) that is not a valid rule table; the message names the file."""


@dataclass(frozen=True)
class ModuleName:
    """``Module.<path>.<Class>.forward.<call>`` with the wrapper segments dropped from ``path``."""

    raw: str
    path: str
    cls: str
    call: int

    @property
    def layer(self) -> int | None:
        return layer_of(self.path)


def layer_of(path: str) -> int | None:
    """The decoder layer of a module path (dumped or canonical: ``layers.3.mlp``), None outside the layers."""
    match = _LAYER.search(path)
    return int(match.group(2)) if match else None


def kind(name: str) -> EntryKind:
    """What a dumped entry is by its name: a module's forward, an API row (level mix/L1), a backward row, other."""
    if name.startswith("Module."):
        return EntryKind.MODULE if ".forward." in name else EntryKind.BACKWARD
    if name.startswith(API_PREFIXES):
        return EntryKind.BACKWARD if name.endswith(".backward") else EntryKind.API
    return EntryKind.OTHER


def parse(name: str) -> ModuleName | None:
    """A module forward entry's name, parsed; None for anything else."""
    parts = name.split(".")
    if len(parts) < 5 or parts[0] != "Module" or parts[-2] != "forward" or not parts[-1].isdigit():
        return None
    path = parts[1:-3]
    if path and path[0].isdigit():  # msprobe's model-chunk index (start(model=[m0, m1]))
        path = path[1:]
    path = [p for p in path if p not in WRAPPER_SEGMENTS]
    return ModuleName(raw=name, path=".".join(path), cls=parts[-3], call=int(parts[-1]))


# --- the rule table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One row of the name map: a canonical module, the names it covers, how it is compared."""

    module: str  # canonical path, with {layer}
    names: tuple[str, ...]
    compare: CompareKind = CompareKind.ONE_TO_ONE
    parts: tuple[str, ...] = ()
    reason: str | None = None  # not_comparable: the text
    stream: str | None = None  # norm: whose output its output 1 also is
    also: tuple[tuple[str, str, str], ...] = ()  # (own io, canonical module, io)
    classes: frozenset[str] = frozenset()
    source: str = ""  # the file it came from
    parallel: str | None = None  # how a tensor-parallel engine splits it (shards.PARALLEL); None: whole on every rank
    shard_dim: int = -1  # the dimension its slices are cut along


@dataclass(frozen=True)
class _Pattern:
    regex: re.Pattern[str]
    segments: int
    rule: Rule
    part: int | None  # index in the rule's fused parts; None: the rule's own name


class NameMap:
    """The rules in force: a user's first (by module: a user rule replaces the built-in one), then the built-in."""

    def __init__(self, rules: Iterable[Rule], reasons: Mapping[str, str]) -> None:
        self.rules = tuple(rules)
        self.reasons = dict(reasons)
        by_last: dict[str, list[_Pattern]] = {}
        for rule in self.rules:
            for part, pattern in [(None, name) for name in rule.names] + list(enumerate(rule.parts)):
                segments = pattern.split(".")
                compiled = _Pattern(_compile(segments), len(segments), rule, part)
                last = segments[-1] if "{" not in segments[-1] else "*"  # a layer number: any last segment
                by_last.setdefault(last, []).append(compiled)
        self._by_last = by_last
        self._found: dict[tuple[str, str], tuple[Rule, int | None, int | None] | None] = {}
        self._fused = [(_compile(rule.module.split(".")), len(rule.parts)) for rule in self.rules if rule.parts]
        self._parallel = [
            (_compile(rule.module.split(".")), rule, rule.parallel) for rule in self.rules if rule.parallel
        ]

    def lookup(self, path: str, cls: str) -> tuple[Rule, int | None, int | None] | None:
        """(rule, part, layer) of the first rule covering ``path`` (a module of class ``cls``), or None."""
        key = (path, cls)
        if key not in self._found:  # a dump repeats its paths per layer and call; pairs repeat them all
            if len(self._found) >= LOOKUPS_HELD:
                self._found.clear()
            self._found[key] = self._search(path, cls)
        return self._found[key]

    def _search(self, path: str, cls: str) -> tuple[Rule, int | None, int | None] | None:
        path = path or cls  # a model's root module: its class stands for its (empty) path
        candidates = self._by_last.get(path.rsplit(".", 1)[-1], []) + self._by_last.get("*", [])
        # A rule naming classes first (Megatron's IdentityOp where a q_layernorm would be), then the longest
        # pattern, then table order (a user's rules come first): sorted() is stable.
        for pattern in sorted(candidates, key=lambda p: (not p.rule.classes, -p.segments)):
            if pattern.rule.classes and cls not in pattern.rule.classes:
                continue
            match = pattern.regex.search(path)
            if match:
                layer = match.groupdict().get("layer")
                return pattern.rule, pattern.part, None if layer is None else int(layer)
        return None

    def canonical(self, name: ModuleName) -> tuple[str, int | None]:
        """The canonical module path (``layers.1.self_attn.qkv_proj``) and the part index in a fused key."""
        found = self.lookup(name.path, name.cls)
        if found is None:
            return _unruled(name.path), None
        rule, part, layer = found
        return _instantiate(rule.module, layer), part

    def parts_of(self, module: str) -> int | None:
        """How many parts the training side dumps a fused canonical module as (``layers.3.self_attn.qkv_proj``: 3)."""
        return next((count for regex, count in self._fused if regex.fullmatch(module)), None)

    def sharding(self, module: str, io: str) -> Sharding | None:
        """How a tensor-parallel engine splits tensor ``io`` (input|output) of canonical ``module``; None: whole."""
        for regex, rule, parallel in self._parallel:
            if regex.fullmatch(module):
                split = io in PARALLEL[parallel]
                return Sharding(rule.shard_dim, len(rule.parts) if io == "output" else 0) if split else None
        return None

    def reason(self, key_or_text: str) -> str:
        """The sentence of a reason key (a rule's own sentence stays as it is)."""
        return self.reasons.get(key_or_text, key_or_text)


def _compile(segments: list[str]) -> re.Pattern[str]:
    pieces = []
    for segment in segments:
        if segment == "*":
            pieces.append(r"[^.]+")
        elif "{layer}" in segment:
            before, _, after = segment.partition("{layer}")
            pieces.append(re.escape(before) + r"(?P<layer>\d+)" + re.escape(after))
        else:
            pieces.append(re.escape(segment))
    return re.compile(r"(?:^|\.)" + r"\.".join(pieces) + "$")


def shift_layers(module: str, offset: int) -> str:
    """``module`` with its decoder layer moved by ``offset``: a pipeline stage's own numbering made the model's."""
    return _LAYER.sub(lambda m: f"{m.group(1)}layers.{int(m.group(2)) + offset}", module, count=1)


def _instantiate(template: str, layer: int | None) -> str:
    return template.replace("{layer}", str(layer)) if layer is not None else template


def _unruled(path: str) -> str:
    """A module no rule covers keeps its path, from ``layers.N`` on when inside a decoder layer."""
    match = _LAYER.search(path)
    return path[match.start() + (1 if path[match.start()] == "." else 0) :] if match else path


def _rule(raw: Any, where: str, reasons: Mapping[str, str]) -> Rule:
    if not isinstance(raw, dict) or not isinstance(raw.get("module"), str) or not raw["module"]:
        raise MappingError(f"{where}: each rule is a mapping with a module (a canonical path)")
    unknown = set(raw) - _RULE_FIELDS
    if unknown:
        raise MappingError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; accepted: {sorted(_RULE_FIELDS)}")

    def strings(name: str, default: list[str]) -> tuple[str, ...]:
        value = raw.get(name, default)
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise MappingError(f"{where}: {name} must be a list of module paths")
        return tuple(value)

    given = raw.get("compare", CompareKind.ONE_TO_ONE)
    if given not in KINDS:
        raise MappingError(f"{where}: compare: {given!r}; accepted: {', '.join(KINDS)}")
    compare = CompareKind(given)
    reason = raw.get("reason")
    if compare is CompareKind.NOT_COMPARABLE and not isinstance(reason, str):
        raise MappingError(f"{where}: a not_comparable rule needs a reason (a key of reasons, or a sentence)")
    stream = raw.get("stream")
    if stream is not None and stream not in _STREAMS:
        raise MappingError(f"{where}: stream: {stream!r}; accepted: {', '.join(_STREAMS)}")
    also = []
    for io, target in (raw.get("also") or {}).items():
        module, _, target_io = str(target).rpartition(" ")
        if io not in ("input", "output") or not module or target_io not in ("input", "output"):
            raise MappingError(
                f"{where}: also: {io}: {target!r}; expected input|output: 'canonical_module input|output'"
            )
        also.append((io, module, target_io))
    parallel = raw.get("parallel")
    if parallel is not None and parallel not in PARALLEL:
        raise MappingError(f"{where}: parallel: {parallel!r}; accepted: {', '.join(PARALLEL)}")
    shard_dim = raw.get("shard_dim", -1)
    if not isinstance(shard_dim, int) or isinstance(shard_dim, bool) or shard_dim >= 0:
        raise MappingError(f"{where}: shard_dim: {shard_dim!r}; expected a negative dimension (-1: the last)")
    return Rule(
        module=raw["module"],
        names=strings("names", [raw["module"]]),
        compare=compare,
        parts=strings("parts", []),
        reason=None if reason is None else reasons.get(reason, reason),
        stream=stream,
        also=tuple(also),
        classes=frozenset(strings("classes", [])),
        source=where,
        parallel=parallel,
        shard_dim=shard_dim,
    )


def read_rules(path: str, reasons: Mapping[str, str] | None = None) -> tuple[list[Rule], dict[str, str]]:
    """The rules and reasons of one name-map file (YAML or JSON); MappingError names what is wrong."""
    import yaml  # JSON is YAML: one reader for both

    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as exc:
        raise MappingError(f"{path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise MappingError(f"{path}: not YAML or JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rules", []), list):
        raise MappingError(f"{path}: expected a mapping with a rules list (and optionally reasons)")
    own = data.get("reasons") or {}
    if not isinstance(own, dict):
        raise MappingError(f"{path}: reasons must map a key to a sentence")
    known = {**(reasons or {}), **{str(k): str(v) for k, v in own.items()}}
    rules = [_rule(raw, f"{path}: rule {i + 1}", known) for i, raw in enumerate(data.get("rules") or [])]
    return rules, known


@functools.lru_cache(maxsize=8)
def load(mapping: str | None = None) -> NameMap:
    """The built-in table, with the rules of the file ``mapping`` (a user's) taking precedence."""
    rules, reasons = read_rules(BUILTIN_MAP)
    if mapping is None:
        return NameMap(rules, reasons)
    mine, reasons = read_rules(mapping, reasons)
    replaced = {rule.module for rule in mine}
    return NameMap(mine + [rule for rule in rules if rule.module not in replaced], reasons)


# --- one entry's tensors ------------------------------------------------------------------------


@dataclass
class Mapped:
    """One dumped tensor of an entry: where it goes (keys) or why it goes nowhere (reason)."""

    label: str  # msprobe's suffix: "output.0", "input.1", "input_kwargs.hidden_states", "parameters.weight"
    tensor: Mapping[str, Any]
    keys: list[tuple[str, str]] = field(default_factory=list)  # primary key first, then aliases
    part: int | None = None
    reason: str | None = None
    # Also (an alias) the output of the model's last decoder layer, whose number only the whole dump tells.
    last_layer_output: bool = False


def _is_tensor(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "torch.Tensor"


def _tensors(values: Any, label: str) -> list[tuple[str, dict]]:
    if isinstance(values, dict):
        values = [values]
    return [(f"{label}.{i}", v) for i, v in enumerate(values or []) if _is_tensor(v)]


def _is_float(tensor: Mapping[str, Any]) -> bool:
    return "float" in str(tensor.get("dtype", "")) or "bfloat" in str(tensor.get("dtype", ""))


@dataclass
class _Entry:
    """What a kind of comparison is handed: the entry's tensors and where its keys go."""

    table: NameMap
    rule: Rule | None
    module: str
    layer: int | None
    part: int | None
    inputs: list[tuple[str, dict]]
    kwargs: list[tuple[str, dict]]
    outputs: list[tuple[str, dict]]

    def none(self, items: list[tuple[str, dict]], reason: str) -> Iterator[Mapped]:
        text = self.table.reason(reason)
        for label, tensor in items:
            yield Mapped(label, tensor, reason=text)

    def keys(self, io: str) -> list[tuple[str, str]]:
        """(module, io) and the aliases the rule gives that tensor."""
        keys = [(self.module, io)]
        if self.rule is not None:
            keys += [(_instantiate(m, self.layer), target) for own, m, target in self.rule.also if own == io]
        return keys


def _one_to_one(e: _Entry) -> Iterator[Mapped]:
    """Input 0 and output 0; the other inputs are not activations, the other outputs biases."""
    if e.part is not None:  # one projection of a fused key (q of qkv, gate of gate_up)
        if e.outputs:
            yield Mapped(*e.outputs[0], keys=[(e.module, "output")], part=e.part)
        yield from e.none(e.outputs[1:], "bias_output")
        if e.inputs and e.part == 0:
            yield Mapped(*e.inputs[0], keys=[(e.module, "input")])
        elif e.inputs:
            yield Mapped(*e.inputs[0], reason=e.table.reason("part_input"))
        yield from e.none(e.inputs[1:] + e.kwargs, "extra_input")
        return
    if e.inputs:
        yield Mapped(*e.inputs[0], keys=e.keys("input"))
    yield from e.none(e.inputs[1:] + e.kwargs, "extra_input")
    if e.outputs:
        yield Mapped(*e.outputs[0], keys=e.keys("output"))
    yield from e.none(e.outputs[1:], "bias_output")


def _norm(e: _Entry) -> Iterator[Mapped]:
    """vLLM/SGLang fuse the residual add: ``(x, residual) -> (y, x + residual)``; output 1 is the stream."""
    if len(e.outputs) < 2:
        yield from _one_to_one(e)
        return
    yield Mapped(*e.outputs[0], keys=[(e.module, "output")])
    stream = [(e.module, "input")]
    if e.rule is not None and e.rule.stream == "previous_layer" and e.layer:
        stream.append((f"layers.{e.layer - 1}", "output"))
    last_layer = e.rule is not None and e.rule.stream == "last_layer"
    yield Mapped(*e.outputs[1], keys=stream, last_layer_output=last_layer)
    yield from e.none(e.outputs[2:], "extra_input")
    yield from e.none(e.inputs + e.kwargs, "fused_norm_input")


def _decoder_layer(e: _Entry) -> Iterator[Mapped]:
    if len(e.outputs) >= 2 and e.outputs[1][1].get("shape") == e.outputs[0][1].get("shape"):
        yield from e.none(e.outputs, "layer_split_output")
    elif len(e.outputs) == 1 and e.inputs and not _is_float(e.inputs[0][1]):
        # An inference engine's layer (positions first) that returns its sublayer output alone and keeps the
        # residual outside (SGLang 0.5.21's Qwen3DecoderLayer): not the stream either.
        yield from e.none(e.outputs, "layer_residual_apart")
    else:
        if e.outputs:
            yield Mapped(*e.outputs[0], keys=[(e.module, "output")])
        yield from e.none(e.outputs[1:], "extra_input")
    yield from e.none(e.inputs + e.kwargs, "layer_input")


def _attention(e: _Entry) -> Iterator[Mapped]:
    if e.outputs:
        yield Mapped(*e.outputs[0], keys=[(e.module, "output")])
    yield from e.none(e.inputs + e.kwargs, "attn_input")


def _activation(e: _Entry) -> Iterator[Mapped]:
    inputs, outputs = e.inputs, e.outputs
    fused = inputs and outputs and inputs[0][1].get("shape", [0])[-1:] != outputs[0][1].get("shape", [0])[-1:]
    if not fused:
        yield from e.none(inputs + outputs, "gate_activation")
        return
    yield Mapped(*outputs[0], keys=[(e.module, "output")])
    yield from e.none(inputs, "act_input")


def _attention_block(e: _Entry) -> Iterator[Mapped]:
    hidden = [item for item in e.kwargs if item[0] == "input_kwargs.hidden_states"]
    hidden = hidden or [item for item in e.inputs if _is_float(item[1])][:1]
    if hidden:
        yield Mapped(*hidden[0], keys=[(e.module, "input")])
    yield from e.none([i for i in e.inputs + e.kwargs if i not in hidden], "extra_input")
    if e.outputs:
        yield Mapped(*e.outputs[0], keys=[(e.module, "output")])
    yield from e.none(e.outputs[1:], "attn_weights")


def _router(e: _Entry) -> Iterator[Mapped]:
    if e.inputs:
        yield Mapped(*e.inputs[0], keys=[(e.module, "input")])
    yield from e.none(e.inputs[1:] + e.kwargs, "extra_input")
    if e.outputs:
        yield Mapped(*e.outputs[0], keys=[(e.module, "output")])
    yield from e.none(e.outputs[1:], "routing")


def _topk(e: _Entry) -> Iterator[Mapped]:
    """An engine's top-k module (SGLang's ``TopK``): the router's logits in, its choice out; read by routing.py."""
    yield from e.none(e.inputs + e.kwargs + e.outputs, "routing")


def _norm_linear(e: _Entry) -> Iterator[Mapped]:
    """A norm fused into the linear after it (TransformerEngine's ``TELayerNormColumnParallelLinear``): output 0
    is the linear's; input 0 is the stream before the norm, compared only as the rule's ``also`` key (the
    norm's input), never as the linear's input (that is after the norm)."""
    if e.inputs:
        aliases = e.keys("input")[1:]
        if aliases:
            yield Mapped(*e.inputs[0], keys=aliases)
        else:
            yield from e.none(e.inputs[:1], "norm_linear_input")
    yield from e.none(e.inputs[1:] + e.kwargs, "extra_input")
    if e.outputs:
        yield Mapped(*e.outputs[0], keys=e.keys("output"))
    yield from e.none(e.outputs[1:], "bias_output")


def _not_comparable(e: _Entry) -> Iterator[Mapped]:
    assert e.rule is not None and e.rule.reason is not None
    yield from e.none(e.inputs + e.kwargs + e.outputs, e.rule.reason)


def _same_name(e: _Entry) -> Iterator[Mapped]:
    """No rule: matched by identical path and tensor label only."""
    for label, tensor in e.inputs + e.kwargs + e.outputs:
        yield Mapped(label, tensor, keys=[(e.module, label)])


KINDS: dict[CompareKind, Callable[[_Entry], Iterator[Mapped]]] = {
    CompareKind.ONE_TO_ONE: _one_to_one,
    CompareKind.NORM: _norm,
    CompareKind.DECODER_LAYER: _decoder_layer,
    CompareKind.ATTENTION: _attention,
    CompareKind.ATTENTION_BLOCK: _attention_block,
    CompareKind.ACTIVATION: _activation,
    CompareKind.ROUTER: _router,
    CompareKind.TOPK: _topk,
    CompareKind.NORM_LINEAR: _norm_linear,
    CompareKind.NOT_COMPARABLE: _not_comparable,
}


def map_entry(name: ModuleName, entry: Mapping[str, Any], table: NameMap | None = None) -> Iterator[Mapped]:
    """Every tensor of one module entry, mapped by the rule covering it (``table``: the built-in map)."""
    table = table or load()
    found = table.lookup(name.path, name.cls)
    rule, part, layer = found if found is not None else (None, None, name.layer)
    for pname, tensor in (entry.get("parameters") or {}).items():
        if _is_tensor(tensor):
            yield Mapped(f"parameters.{pname}", tensor, reason=table.reason("parameter"))
    mapped = _Entry(
        table=table,
        rule=rule,
        module=_instantiate(rule.module, layer) if rule is not None else _unruled(name.path),
        layer=layer,
        part=part,
        inputs=_tensors(entry.get("input_args"), "input"),
        kwargs=[(f"input_kwargs.{k}", v) for k, v in (entry.get("input_kwargs") or {}).items() if _is_tensor(v)],
        outputs=_tensors(entry.get("output"), "output"),
    )
    yield from (KINDS[rule.compare] if rule is not None else _same_name)(mapped)
