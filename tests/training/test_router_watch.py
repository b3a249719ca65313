"""The training side's routed-experts record (``msprobe_hooks.training.routed_experts``) and the shared reading of a
router's output (``msprobe_hooks.routing``), on a real tiny Hugging Face Qwen3-MoE and on a Megatron-shaped router.

Its real runs (verl's FSDP2 engine dumping in statistics and tensor mode) made the golden ``moe`` trees; the
analysis over them is ``tests/analysis/test_moe.py``. Here: what a window records, checked against the router's own
outputs; what a window leaves behind (no hook); what is not a router's choice.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3MoeForCausalLM

from cpu_kit import moe_inputs
from msprobe_hooks.join_keys import ROUTED_EXPERTS_LOG
from msprobe_hooks.routing import router_choice
from msprobe_hooks.training.routed_experts import RouterWatch

TOP_K = moe_inputs.TOP_K


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Qwen3MoeForCausalLM:
    folder = moe_inputs.build_qwen3_moe_dir(str(tmp_path_factory.mktemp("router-watch") / "moe"), layers=2)
    return Qwen3MoeForCausalLM.from_pretrained(folder).eval()


def _lines(root) -> list[dict]:
    (path,) = root.glob(f"*/{ROUTED_EXPERTS_LOG}")
    return [json.loads(text) for text in path.read_text().splitlines()]


def test_a_window_records_what_each_router_returned_then_leaves_no_hook(tmp_path, model):
    returned = {}  # the routers' own outputs, taken by a hook of the test's, the oracle
    handles = [
        layer.mlp.gate.register_forward_hook(lambda m, a, out, i=i: returned.setdefault(i, out))
        for i, layer in enumerate(model.model.layers)
    ]
    watch = RouterWatch(lambda cfg: str(tmp_path))
    watch.watch(None, model)
    tokens = torch.tensor([[3, 9, 17, 4, 33, 2]])
    with torch.no_grad():
        model(tokens)
    watch.write(step=7, rank=0, global_step=2)
    for handle in handles:
        handle.remove()
    (line,) = _lines(tmp_path)
    assert (line["step"], line["rank"], line["global_step"], line["tokens"]) == (7, 0, 2, tokens.numel())
    for layer, (logits, _, ids) in returned.items():
        assert line["layers"][str(layer)] == ids.tolist()
        top = logits.topk(TOP_K + 1, dim=-1).values
        margins = torch.tensor(line["margins"][str(layer)], dtype=torch.float64)
        torch.testing.assert_close(margins[:, 0], (top[:, TOP_K - 1] - top[:, TOP_K]).double(), rtol=1e-5, atol=1e-12)
        torch.testing.assert_close(margins[:, 1], logits.abs().max(dim=-1).values.double(), rtol=1e-5, atol=1e-12)
    with torch.no_grad():
        model(tokens)  # after the window: no hook of ours is left to keep anything
    watch.write(step=8, rank=0, global_step=2)
    assert len(_lines(tmp_path)) == 1
    assert all(not layer.mlp.gate._forward_hooks for layer in model.model.layers)


def test_a_model_without_routers_gets_no_hook_and_no_line(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    watch = RouterWatch(lambda cfg: str(tmp_path))
    watch.watch(None, model)
    model(torch.ones(1, 4))
    watch.write(step=0, rank=0, global_step=None)
    assert not list(tmp_path.rglob(ROUTED_EXPERTS_LOG))


def test_a_routing_map_gives_the_ids_and_no_margins_and_other_outputs_no_choice():
    """Megatron's TopKRouter returns (probs, routing_map): its probs hold the chosen experts' scores only, zeros
    elsewhere, so a margin read from them would always be wide: none is given."""
    routing_map = torch.tensor([[True, False, True, False], [False, True, False, True]])
    probs = routing_map.float() * 0.5
    ids, margins = router_choice((probs, routing_map))
    assert ids.tolist() == [[0, 2], [1, 3]] and margins is None
    assert router_choice(torch.ones(2, 4)) is None  # floating only: no choice
    assert router_choice((probs, torch.tensor([[True, False, False, False], [True, True, False, False]]))) is None
