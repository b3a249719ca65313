"""The experts MoE routers chose, as both sides record them: ``routed_experts.jsonl``, one line per dumped step.

Each side writes ``{dump root}/{pid}/routed_experts.jsonl`` (:data:`~msprobe_hooks.join_keys.ROUTED_EXPERTS_LOG`)
beside its own log, from its engine's own routers, whatever msprobe's task (statistics dumps hold only the max and
min of the ids, so a statistics dump alone cannot say which experts a token went to)::

    {"step": 3, "rank": 0, "dumped": true, "tokens": 12,
     "requests": [{"request_id": "req-1-1a2b3c4d", "request_id_base": "req-1", "offset": 0, "tokens": 12}],
     "layers": {"0": [[5, 2], [1, 7], ...], "1": [...]},
     "margins": {"0": [[0.031, 2.4], ...], "1": [...]}}

``step`` is the msprobe ``step{N}`` folder of that forward, ``layers`` maps a decoder layer's number (as the dump
names it: a pipeline stage's own) to the ids ``[tokens, k]`` in the forward's token order. ``margins`` (where the
router's output holds its logits: the training side's Hugging Face routers, SGLang's ``TopK``) gives per token the
k-th largest logit minus the next and the largest ``|logit|``: whether a token another side sends elsewhere sat at a
near tie.
``requests`` (inference) or ``global_step`` (training) say whose tokens they are. Writers:
:mod:`msprobe_hooks.inference.routed_experts` (vLLM's router capture hook, SGLang's ``TopK`` modules) and
:mod:`msprobe_hooks.training.routed_experts` (forward hooks on the routers of a dumped window); reader:
:mod:`msprobe_hooks.analysis.comparing.routing`. This module imports nothing heavy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_SIGNIFICANT = 6  # digits a margin keeps: far finer than any noise it is weighed against, and short lines


def layer_of(module_name: str, fallback: Any = None) -> int | None:
    """The decoder layer a module's dotted name sits in (``model.layers.3.mlp.experts``: 3), else ``fallback``."""
    match = _LAYER.search(module_name + ".")
    if match:
        return int(match.group(1))
    return fallback if isinstance(fallback, int) else None


def router_choice(output: Any) -> tuple[Any, Any] | None:
    """A router's choice from its forward's output: (expert ids ``[T, k]``, margins ``[T, 2]`` or None); None when
    the output holds no choice.

    The ids are its integer output (Hugging Face's ``*TopKRouter``: ``(logits, weights, ids)``), else a boolean
    routing map ``[T, E]`` with the same count in every row (Megatron's ``TopKRouter``: ``(probs, routing_map)``).
    The margins come from the first floating output beside integer ids when that holds a value per expert (the
    logits); a routing map's scores hold the chosen experts' only: no margins."""
    import torch

    tensors = [output] if isinstance(output, torch.Tensor) else [t for t in output or () if isinstance(t, torch.Tensor)]
    ids = next((t for t in tensors if t.dim() and not t.is_floating_point() and t.dtype != torch.bool), None)
    logits = next((t for t in tensors if t.is_floating_point()), None)
    if ids is None:
        logits = None  # beside a routing map, a router's floating output holds the chosen experts' scores only
        routing_map = next((t for t in tensors if t.dim() and t.dtype == torch.bool), None)
        if routing_map is None:
            return None
        routing_map = routing_map.reshape(-1, routing_map.shape[-1])
        counts = routing_map.sum(dim=-1)
        if not len(counts) or int(counts.min()) != int(counts.max()) or not int(counts[0]):
            return None
        ids = routing_map.nonzero()[:, 1].reshape(len(counts), -1)
    ids = ids.detach().reshape(-1, ids.shape[-1]).to("cpu", torch.long)
    k = ids.shape[-1]
    if logits is None or logits.shape[-1] <= k or logits.numel() // logits.shape[-1] != ids.shape[0]:
        return ids, None
    logits = logits.detach().reshape(-1, logits.shape[-1]).to("cpu", torch.float64)
    ordered = logits.topk(k + 1, dim=-1).values
    margins = torch.stack((ordered[:, k - 1] - ordered[:, k], logits.abs().max(dim=-1).values), dim=-1)
    return ids, _significant(margins)


def choices_by_layer(calls: Mapping[int, Sequence[Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per decoder layer (``calls``: each router call's output, in call order) the ids the calls chose and, where
    every call gave them, their margins, as the record's ``layers`` and ``margins``; a layer one of whose calls holds
    no choice is left out (nothing is said of it)."""
    import torch

    layers, margins = {}, {}
    for layer, outputs in sorted(calls.items()):
        found = [router_choice(output) for output in outputs]
        choices = [choice for choice in found if choice is not None]
        if not choices or len(choices) < len(found):
            continue
        layers[str(layer)] = torch.cat([ids for ids, _ in choices]).tolist()
        if all(margin is not None for _, margin in choices):
            margins[str(layer)] = torch.cat([margin for _, margin in choices]).tolist()
    return layers, margins


def _significant(values: Any) -> Any:
    """``values`` rounded to :data:`_SIGNIFICANT` significant digits (their JSON stays short)."""
    import torch

    exponent = torch.floor(torch.log10(values.abs().clamp_min(1e-300)))
    scale = torch.pow(10.0, _SIGNIFICANT - 1 - exponent)
    return torch.round(values * scale) / scale
