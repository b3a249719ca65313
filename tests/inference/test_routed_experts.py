"""The routed-experts record (``msprobe_hooks.inference.routed_experts``): binding routers, one line per step.

The real vLLM engine binds and writes it in ``tests/analysis/test_compare_moe.py`` (and the golden ``moe`` trees
were cut from such runs); here, what those runs do not reach: a capture hook already set keeps being called, a
failing record never reaches the forward, a packed step's rows, a step with no router call writes nothing.
"""

from __future__ import annotations

import json

import torch

from msprobe_hooks.inference.dispatch_log import ScheduledRequest
from msprobe_hooks.inference.routed_experts import RoutingRecorder, bind
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
