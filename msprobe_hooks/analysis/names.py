"""Which dumped tensor of a training engine is which dumped tensor of an inference engine.

Every ``Module.*`` entry of a ``dump.json`` is parsed into a module path (wrapper segments
dropped) and mapped to canonical keys ``(module, io)``: ``("layers.1.mlp.down_proj", "output")``.
Two tensors with the same key, one per side, are the same quantity; a tensor that has no
counterpart by construction gets a reason instead of a key. The mapping is the measured one of
``reference/train-vs-vllm-dumps.md`` (FSDP2 training dumps against vLLM 0.32 dumps):

* training names: HF paths, under FSDP1 with ``_fsdp_wrapped_module.`` segments, under FSDP2
  plain; Megatron's ``decoder.layers.N.self_attention.linear_qkv`` … (mapped as msprobe's own
  Megatron map does; not measured on real Megatron dumps here);
* inference names: vLLM's and SGLang's ``qkv_proj``, ``gate_up_proj``, ``attn``, ``rotary_emb``,
  ``logits_processor``;
* separate q/k/v (gate/up) projections are parts of one fused key, combined exactly
  (:func:`statistics.fuse`);
* a norm with two outputs is vLLM's fused-residual RMSNorm: ``(x, residual) -> (y, x + residual)``;
  output 0 is the norm's output, output 1 the residual stream, i.e. the training norm's input 0 and
  the previous decoder layer's output;
* a decoder layer that returns ``(mlp_out, residual)`` has no single output to compare: the stream
  is their sum and is compared at the next norm's output 1;
* the whole decoder stack (``model``, SGLang's ``Qwen2Model``) is dumped on the inference side
  only: msprobe skips a model's first child under verl; its output is the final norm's.

Entries that are not ``Module.<path>.<Class>.forward.<n>`` (msprobe's API rows at level mix,
backward rows) are classified, never mapped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

# Path segments that wrap a module without changing what it computes.
WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod", "module"})
API_PREFIXES = ("Functional.", "Tensor.", "Torch.", "VF.", "Distributed.", "NPU.", "Triton.", "Aten.")

QKV, GATE_UP = "self_attn.qkv_proj", "mlp.gate_up_proj"
# A module path inside ``layers.N.`` -> (canonical path inside the layer, part index in a fused key).
IN_LAYER: dict[str, tuple[str, int | None]] = {
    "self_attn.q_proj": (QKV, 0),
    "self_attn.k_proj": (QKV, 1),
    "self_attn.v_proj": (QKV, 2),
    "self_attn.qkv_proj": (QKV, None),
    "self_attention.linear_qkv": (QKV, None),
    "self_attn.o_proj": ("self_attn.o_proj", None),
    "self_attention.linear_proj": ("self_attn.o_proj", None),
    "self_attn.attn": ("self_attn.attn", None),
    "self_attention.core_attention": ("self_attn.attn", None),
    "self_attn": ("self_attn", None),
    "self_attention": ("self_attn", None),
    "self_attn.rotary_emb": ("rotary_emb", None),
    "input_layernorm": ("input_layernorm", None),
    "post_attention_layernorm": ("post_attention_layernorm", None),
    "pre_mlp_layernorm": ("post_attention_layernorm", None),
    "mlp.gate_proj": (GATE_UP, 0),
    "mlp.up_proj": (GATE_UP, 1),
    "mlp.gate_up_proj": (GATE_UP, None),
    "mlp.linear_fc1": (GATE_UP, None),
    "mlp.act_fn": ("mlp.act_fn", None),
    "mlp.down_proj": ("mlp.down_proj", None),
    "mlp.linear_fc2": ("mlp.down_proj", None),
    "mlp": ("mlp", None),
    "": ("", None),
}
# How many parts a fused key has when the training side dumps them apart.
FUSED_PARTS = {QKV: 3, GATE_UP: 2}
# The last path segment of a module outside the decoder layers -> canonical name.
OUTSIDE_LAYERS = {
    "embed_tokens": "embed_tokens",
    "word_embeddings": "embed_tokens",
    "norm": "norm",
    "final_layernorm": "norm",
    "rotary_emb": "rotary_emb",
    "rotary_pos_emb": "rotary_emb",
    "lm_head": "lm_head",
    "output_layer": "lm_head",
    "logits_processor": "lm_head",
    "model": "model",
}
NORMS = ("input_layernorm", "post_attention_layernorm", "norm")
# Canonical modules none of whose tensors has a counterpart, and why (a key of REASONS).
NO_COUNTERPART = {"rotary_emb": "rotary", "lm_head": "head", "model": "whole_model"}
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.(.*))?$")
# Placeholder for "the last decoder layer", resolved once a whole dump has been read.
LAST_LAYER = -1

REASONS = {
    "rotary": "rotary embedding: the training model returns (cos, sin) once, the inference engine rotates q and k "
    "per layer (one shared module, call counter = layer)",
    "head": "logits: msprobe skips lm_head under verl, and the inference engine computes the last token only",
    "whole_model": "the whole decoder stack: msprobe skips it on the training side under verl (a model's first "
    "child); its output is the final norm's output, compared there",
    "parameter": "parameter: inference engines prepack or shard weights (vLLM CPU leaves .weight empty); "
    "a weight change shows in the activations",
    "fused_norm_input": "fused-residual norm input: the sublayer output and the residual apart; the stream is output 1",
    "layer_split_output": "(sublayer output, residual) apart: the stream is their sum, compared at the next norm's "
    "output 1",
    "layer_input": "the stream entering the layer: compared as its input_layernorm input",
    "part_input": "the same tensor as the first projection's input (compared as the fused input)",
    "attn_input": "rotated q, k, v: the training side rotates inside attention, no module sees them",
    "attn_weights": "attention weights: only the training side returns them",
    "gate_activation": "the activation of the gate alone; the inference engine fuses silu(gate)*up "
    "(compared as down_proj input)",
    "act_input": "the gate_up_proj output, compared there",
    "extra_input": "not an activation of the model (positions, masks, caches)",
    "bias_output": "bias returned apart",
}


@dataclass(frozen=True)
class ModuleName:
    """``Module.<path>.<Class>.forward.<call>`` with the wrapper segments dropped from ``path``."""

    raw: str
    path: str
    cls: str
    call: int

    @property
    def layer(self) -> int | None:
        match = _LAYER.search(self.path)
        return int(match.group(1)) if match else None


def kind(name: str) -> str:
    """``module`` (a module's forward), ``api`` (level mix/L1 API rows), ``backward``, or ``other``."""
    if name.startswith("Module."):
        return "module" if ".forward." in name else "backward"
    if name.startswith(API_PREFIXES):
        return "backward" if name.endswith(".backward") else "api"
    return "other"


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


def canonical(name: ModuleName) -> tuple[str, int | None]:
    """The canonical module path (``layers.1.self_attn.qkv_proj``) and the part index in a fused key."""
    match = _LAYER.search(name.path)
    if match:
        inner, part = IN_LAYER.get(match.group(2) or "", (match.group(2) or "", None))
        if inner == "rotary_emb":
            return "rotary_emb", None
        return f"layers.{match.group(1)}" + (f".{inner}" if inner else ""), part
    last = name.path.rsplit(".", 1)[-1]
    return OUTSIDE_LAYERS.get(last, name.path), None


@dataclass
class Mapped:
    """One dumped tensor of an entry: where it goes (keys) or why it goes nowhere (reason)."""

    label: str  # msprobe's suffix: "output.0", "input.1", "input_kwargs.hidden_states", "parameters.weight"
    tensor: Mapping[str, Any]
    keys: list[tuple[str, str]] = field(default_factory=list)  # primary key first, then aliases
    part: int | None = None
    reason: str | None = None


def _is_tensor(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "torch.Tensor"


def _tensors(values: Any, label: str) -> list[tuple[str, dict]]:
    if isinstance(values, dict):
        values = [values]
    return [(f"{label}.{i}", v) for i, v in enumerate(values or []) if _is_tensor(v)]


def _is_float(tensor: Mapping[str, Any]) -> bool:
    return "float" in str(tensor.get("dtype", "")) or "bfloat" in str(tensor.get("dtype", ""))


def map_entry(name: ModuleName, entry: Mapping[str, Any]) -> Iterator[Mapped]:
    """Every tensor of one module entry, mapped (see the module docstring for the rules)."""
    module, part = canonical(name)
    inputs = _tensors(entry.get("input_args"), "input")
    kwargs = [(f"input_kwargs.{k}", v) for k, v in (entry.get("input_kwargs") or {}).items() if _is_tensor(v)]
    outputs = _tensors(entry.get("output"), "output")
    for pname, tensor in (entry.get("parameters") or {}).items():
        if _is_tensor(tensor):
            yield Mapped(f"parameters.{pname}", tensor, reason=REASONS["parameter"])

    def none(items: list[tuple[str, dict]], reason: str) -> Iterator[Mapped]:
        for label, tensor in items:
            yield Mapped(label, tensor, reason=REASONS[reason])

    leaf = module.split(".")[-1] if module.startswith("layers.") else module
    layer = name.layer
    if module in NO_COUNTERPART:
        yield from none(inputs + kwargs + outputs, NO_COUNTERPART[module])
        return
    if leaf in NORMS:
        if len(outputs) >= 2:  # vLLM/SGLang fused residual: (x, residual) -> (y, x + residual)
            yield Mapped(*outputs[0], keys=[(module, "output")])
            stream = [(module, "input")]
            if leaf == "input_layernorm" and layer:
                stream.append((f"layers.{layer - 1}", "output"))
            elif module == "norm":
                stream.append((f"layers.{LAST_LAYER}", "output"))
            yield Mapped(*outputs[1], keys=stream)
            yield from none(outputs[2:], "extra_input")
            yield from none(inputs + kwargs, "fused_norm_input")
            return
        yield from _plain(module, inputs, kwargs, outputs)
        return
    if module.startswith("layers.") and module.count(".") == 1:  # the decoder layer itself
        if len(outputs) >= 2 and outputs[1][1].get("shape") == outputs[0][1].get("shape"):
            yield from none(outputs, "layer_split_output")
        else:
            if outputs:
                yield Mapped(*outputs[0], keys=[(module, "output")])
            yield from none(outputs[1:], "extra_input")
        yield from none(inputs + kwargs, "layer_input")
        return
    if part is not None:  # one projection of a fused key
        if outputs:
            yield Mapped(*outputs[0], keys=[(module, "output")], part=part)
        yield from none(outputs[1:], "bias_output")
        if inputs and part == 0:
            yield Mapped(*inputs[0], keys=[(module, "input")])
        elif inputs:
            yield Mapped(*inputs[0], reason=REASONS["part_input"])
        yield from none(inputs[1:] + kwargs, "extra_input")
        return
    if leaf == "attn":
        if outputs:
            yield Mapped(*outputs[0], keys=[(module, "output")])
        yield from none(inputs + kwargs, "attn_input")
        return
    if leaf == "act_fn":
        fused = inputs and outputs and inputs[0][1].get("shape", [0])[-1:] != outputs[0][1].get("shape", [0])[-1:]
        if not fused:
            yield from none(inputs + outputs, "gate_activation")
            return
        yield Mapped(*outputs[0], keys=[(module, "output")])
        yield from none(inputs, "act_input")
        return
    if leaf == "self_attn":
        hidden = [item for item in kwargs if item[0] == "input_kwargs.hidden_states"]
        hidden = hidden or [item for item in inputs if _is_float(item[1])][:1]
        if hidden:
            yield Mapped(*hidden[0], keys=[(module, "input")])
        yield from none([i for i in inputs + kwargs if i not in hidden], "extra_input")
        if outputs:
            yield Mapped(*outputs[0], keys=[(module, "output")])
        yield from none(outputs[1:], "attn_weights")
        return
    aliases = {
        "o_proj": (f"layers.{layer}.self_attn.attn", "output"),
        "down_proj": (f"layers.{layer}.mlp.act_fn", "output"),
    }
    if leaf in aliases and inputs:  # the linear's input is the sublayer's output that inference engines dump apart
        yield Mapped(*inputs[0], keys=[(module, "input"), aliases[leaf]])
        yield from _plain(module, inputs[1:], kwargs, outputs, first_input=False)
        return
    yield from _plain(module, inputs, kwargs, outputs)


def _plain(module: str, inputs: list, kwargs: list, outputs: list, first_input: bool = True) -> Iterator[Mapped]:
    """Input 0 and output 0 as ``input``/``output``; a known module's other tensors are not activations."""
    known = module in ("embed_tokens", "norm") or module.startswith("layers.")
    if not known:  # a module the map does not know: matched by identical path and position only
        for label, tensor in inputs + kwargs + outputs:
            yield Mapped(label, tensor, keys=[(module, label)])
        return
    if first_input and inputs:
        yield Mapped(*inputs[0], keys=[(module, "input")])
    for label, tensor in (inputs[1:] if first_input else inputs) + kwargs:
        yield Mapped(label, tensor, reason=REASONS["extra_input"])
    if outputs:
        yield Mapped(*outputs[0], keys=[(module, "output")])
    for label, tensor in outputs[1:]:
        yield Mapped(label, tensor, reason=REASONS["bias_output"])
