"""The routed-experts record (``msprobe_hooks.inference.routed_experts``): binding routers, one line per step.

The real vLLM and SGLang engines bind and write it in ``tests/analysis/test_compare_moe.py`` (and the golden ``moe``
trees were cut from such runs); here, what those runs do not reach: a capture hook already set keeps being called, a
failing record never reaches the forward, a packed step's rows, a step with no router call writes nothing, an SGLang
top-k output left as it was and one that holds no ids.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import torch

from msprobe_hooks.inference.dispatch_log import ScheduledRequest
from msprobe_hooks.inference.routed_experts import RoutingRecorder, bind, bind_topk_modules
from msprobe_hooks.join_keys import ROUTED_EXPERTS_LOG
from msprobe_hooks.routing import layer_of


class Router:
    """What vLLM's routers offer a capture: ``set_capture_fn`` and the ``capture_fn`` it sets."""

    def __init__(self) -> None:
        self.capture_fn = None

    def set_capture_fn(self, capture_fn) -> None:
        self.capture_fn = capture_fn


class Runner(torch.nn.Module):
    def __init__(self, layer_id: int) -> None:
        super().__init__()
        self.router = Router()
        self.layer_id = layer_id


class Layer(torch.nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.mlp = torch.nn.Module()
        self.mlp.experts = Runner(layer_id=100 + index)  # the path's layer number wins over layer_id


class Model(torch.nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList(Layer(i) for i in range(layers))


def unguarded(what, work, *args):
    return work(*args)


def request(rid: str, tokens: int) -> ScheduledRequest:
    return ScheduledRequest(rid + "-0123abcd", rid, True, tokens, 0, tokens, None)


def test_every_router_is_bound_by_its_layer_and_a_step_is_one_line(tmp_path):
    model = Model(2)
    recorder = RoutingRecorder(str(tmp_path))
    assert bind(model, recorder, unguarded) == 2
    ids = {0: torch.tensor([[1, 2], [3, 0], [2, 1]]), 1: torch.tensor([[0, 1], [1, 3], [3, 2]])}
    for i, layer in enumerate(model.model.layers):
        layer.mlp.experts.router.capture_fn(ids[i])
    ids[0][0, 0] = 7  # the engine reuses its buffer: the record holds what was captured
    recorder.flush(4, 0, True, [request("a", 2), request("b", 1)])
    recorder.flush(5, 0, True, [request("a", 1)])  # no router ran since: no line
    (path,) = tmp_path.glob(f"*/{ROUTED_EXPERTS_LOG}")
    (line,) = [json.loads(text) for text in path.read_text().splitlines()]
    assert line["step"] == 4 and line["tokens"] == 3 and line["dumped"] is True
    assert line["layers"] == {"0": [[1, 2], [3, 0], [2, 1]], "1": [[0, 1], [1, 3], [3, 2]]}
    assert [(r["request_id_base"], r["offset"], r["tokens"]) for r in line["requests"]] == [("a", 0, 2), ("b", 2, 1)]


def test_a_capture_already_set_is_still_called_and_a_failing_record_never_reaches_the_forward(tmp_path):
    model = Model(1)
    router = model.model.layers[0].mlp.experts.router
    theirs = []
    router.set_capture_fn(theirs.append)  # vLLM's own routed-experts capture
    failures = []

    def guarded(what, work, *args):
        try:
            return work(*args)
        except Exception as exc:  # what PatchContext.guarded does: one warning, the host goes on
            failures.append((what, type(exc).__name__))

    recorder = RoutingRecorder(str(tmp_path))
    bind(model, recorder, guarded)
    ids = torch.tensor([[1, 0]])
    router.capture_fn(ids)
    router.capture_fn("not a tensor")  # our record fails: guarded, theirs still called
    assert theirs == [ids, "not a tensor"]
    assert failures == [("recording the routed experts", "AttributeError")]


def test_modules_without_a_router_hook_bind_nothing(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert bind(model, RoutingRecorder(str(tmp_path)), unguarded) == 0
    assert layer_of("model.layers.12.mlp.experts") == 12 and layer_of("lm_head", 3) == 3 and layer_of("x") is None


def test_a_step_the_driven_debugger_does_not_dump_copies_no_ids(tmp_path):
    """With a dump driven, the routers run at every step and only dumped steps are written: the others' ids must not
    even be copied (a device-to-host copy per router per step), and a dumped step after them holds its own only."""
    model = Model(1)
    recorder = RoutingRecorder(str(tmp_path))
    bind(model, recorder, unguarded)
    capture = model.model.layers[0].mlp.experts.router.capture_fn
    recorder.armed = False  # what VllmRunner.on_started sets for a step msprobe does not record
    capture(torch.tensor([[5, 6]]))
    assert recorder.layers == {}
    recorder.armed = True
    capture(torch.tensor([[1, 2]]))
    recorder.flush(1, 0, True, [request("a", 1)])
    (path,) = tmp_path.glob(f"*/{ROUTED_EXPERTS_LOG}")
    assert [json.loads(text)["layers"] for text in path.read_text().splitlines()] == [{"0": [[1, 2]]}]


class TopKOutput(NamedTuple):  # SGLang's StandardTopKOutput
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor
    router_logits: torch.Tensor


class TopK(torch.nn.Module):
    """SGLang's top-k module by its class name: the router's logits in, its choice out."""

    def forward(self, logits: torch.Tensor):
        weights, ids = logits.softmax(-1).topk(2)
        return TopKOutput(weights, ids, logits)


def _no_ids(self, logits: torch.Tensor):
    return (logits,)


# SGLang's TopK with a backend whose output holds no ids the record reads (its PackedTopKOutput)
PackedTopK = type("TopK", (TopK,), {"forward": _no_ids})


def test_sglangs_top_k_outputs_are_kept_unchanged_and_read_at_the_steps_end_with_their_margins(tmp_path):
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(torch.nn.Module() for _ in range(2))
    model.layers[0].topk = TopK()
    model.layers[1].topk = PackedTopK()
    recorder = RoutingRecorder(str(tmp_path))
    assert bind_topk_modules(model, recorder) == 2
    logits = torch.tensor([[0.1, 2.0, 1.0, 0.5], [3.0, 0.0, 2.9, 1.0]])
    output = model.layers[0].topk(logits)
    assert output.topk_ids.tolist() == [[1, 2], [0, 2]]  # the hook returns nothing: the output is the module's
    model.layers[1].topk(logits)
    recorder.flush(3, 0, True, [request("a", 2)])
    (path,) = tmp_path.glob(f"*/{ROUTED_EXPERTS_LOG}")
    (line,) = [json.loads(text) for text in path.read_text().splitlines()]
    assert line["layers"] == {"0": [[1, 2], [0, 2]]}  # layer 1 held no ids: nothing said of it
    # margin: the k-th logit minus the next (1.0 - 0.5, 2.9 - 1.0), beside each token's largest |logit|
    assert line["margins"] == {"0": [[0.5, 2.0], [1.9, 3.0]]}
