"""The SGLang dispatch-log rows, computed from ForwardBatch-shaped objects (no SGLang needed)."""

from __future__ import annotations

import enum
import logging
from types import SimpleNamespace

import pytest
import torch
from support.dispatch_lines import step_record

from msprobe_hooks import join_keys, patching
from msprobe_hooks.patches.sglang import forward_batch as sglang_forward_batch
from msprobe_hooks.patches.sglang import model_runner as sglang_model_runner
from msprobe_hooks.patches.sglang.forward_batch import REQUESTS_ATTR, RequestIdentity, identities


def batch_requests(batch):
    """(forward mode, request rows as the log writes them, the phase) of a ForwardBatch."""
    mode, scheduled = sglang_model_runner.batch_requests(batch)
    line = step_record(engine="sglang", engine_version="0.5.2", rank=0, step=0, dumped=False, requests=scheduled)
    return mode, line["requests"], line["phase"]


Mode = enum.IntEnum("ForwardMode", "EXTEND DECODE MIXED IDLE")

RECORD_FIELDS = [
    "source",
    "engine",
    "engine_version",
    "timestamp",
    "pid",
    "rank",
    "step",
    "dumped",
    "phase",
    "forward_mode",
    "total_num_scheduled_tokens",
    "num_requests",
    "prefill_requests",
    "requests",
    "prompt_hash_version",  # ours, after the published fields
    "time",
]
REQUEST_FIELDS = [
    "request_id",
    "request_id_base",
    "type",
    "prefill",
    "tokens",
    "offset",
    "computed_tokens",
    "prompt_len",
    "prompt_hash",
    "full_prefill",
]


def _batch(mode, *, extend=None, prefix=None, seq_lens=None, rids=None, attached=None):
    batch = SimpleNamespace(
        forward_mode=mode,
        batch_size=len(extend if extend is not None else seq_lens),
        extend_seq_lens_cpu=extend,
        extend_prefix_lens_cpu=prefix,
        seq_lens_cpu=None if seq_lens is None else torch.tensor(seq_lens),
        rids=rids,
    )
    if attached is not None:
        setattr(batch, REQUESTS_ATTR, attached)
    return batch


def _ident(rid, prompt_len, new=True):
    return RequestIdentity(rid, prompt_len, f"hash-{rid}", new)


def test_record_has_exactly_the_shared_schema():
    mode, scheduled = sglang_model_runner.batch_requests(
        _batch(Mode.EXTEND, extend=[4], prefix=[0], attached=(_ident("a", 4),))
    )
    record = step_record(
        engine="sglang", engine_version="0.5.2", rank=0, step=7, dumped=True, requests=scheduled, forward_mode=mode
    )
    assert list(record) == RECORD_FIELDS
    assert list(record["requests"][0]) == REQUEST_FIELDS
    assert (record["total_num_scheduled_tokens"], record["num_requests"], record["forward_mode"]) == (4, 1, "EXTEND")


def test_mixed_batch_rows_in_token_order():
    batch = _batch(
        Mode.MIXED,
        extend=[3, 1, 1],
        prefix=[2, 7, 4],
        attached=(_ident("chunk", 6, new=False), _ident("a", 5, new=False), _ident("b", 4, new=False)),
    )
    mode, rows, step_phase = batch_requests(batch)
    assert mode == "MIXED"
    assert [(r["request_id"], r["prefill"], r["offset"], r["tokens"], r["computed_tokens"]) for r in rows] == [
        ("chunk", True, 0, 3, 2),
        ("a", False, 3, 1, 7),
        ("b", False, 4, 1, 4),
    ]
    assert [r["type"] for r in rows] == ["cached"] * 3
    assert step_phase == "prefill"  # the published two values: a step with any prompt tokens is a prefill


def test_full_prefill_needs_the_whole_prompt_from_zero():
    attached = (_ident("whole", 4), _ident("hit", 5), _ident("first-chunk", 9))
    _, rows, step_phase = batch_requests(_batch(Mode.EXTEND, extend=[4, 2, 3], prefix=[0, 3, 0], attached=attached))
    assert [r["full_prefill"] for r in rows] == [True, False, False]
    assert [r["prompt_hash"] for r in rows] == ["hash-whole", "hash-hit", "hash-first-chunk"]
    assert step_phase == "prefill"


def test_decode_rows_take_the_cached_length_from_seq_lens():
    _, rows, step_phase = batch_requests(
        _batch(Mode.DECODE, seq_lens=[6, 9], attached=(_ident("a", 5), _ident("b", 4)))
    )
    assert [(r["tokens"], r["offset"], r["computed_tokens"], r["prefill"]) for r in rows] == [
        (1, 0, 5, False),
        (1, 1, 8, False),
    ]
    assert step_phase == "decode"


def test_bare_request_ids_when_no_identities_were_attached():
    """0.5.10+ with the forward-batch patch off: ids from ForwardBatch.rids, the mode tells prefill apart."""
    _, rows, _ = batch_requests(_batch(Mode.MIXED, extend=[3, 1], prefix=[0, 6], rids=["new", "old"]))
    assert [(r["request_id"], r["type"], r["prefill"], r["prompt_len"], r["full_prefill"]) for r in rows] == [
        ("new", "new", True, None, False),
        ("old", "cached", False, None, False),
    ]


@pytest.mark.parametrize("attached", [None, (_ident("only-one", 3),)])
def test_no_ids_at_all_or_a_mismatched_list_gives_anonymous_rows(attached):
    _, rows, _ = batch_requests(_batch(Mode.EXTEND, extend=[3, 2], prefix=[0, 0], attached=attached))
    assert [r["request_id"] for r in rows] == [None, None]
    assert [r["offset"] for r in rows] == [0, 3]


def test_idle_batch_has_no_rows():
    assert batch_requests(_batch(Mode.IDLE, seq_lens=[])) == ("IDLE", [], "decode")


def test_prompt_hash_is_computed_once_per_request(monkeypatch):
    calls = []
    monkeypatch.setattr(sglang_forward_batch.join_keys, "prompt_hash", lambda ids: calls.append(1) or "h")
    req = SimpleNamespace(rid=17, origin_input_ids=[1, 2, 3])
    first, again = identities([req])[0], identities([req])[0]
    assert first == RequestIdentity("17", 3, "h", True)
    assert again == RequestIdentity("17", 3, "h", False)
    assert len(calls) == 1


def test_identities_use_the_shared_prompt_hash():
    req = SimpleNamespace(rid="r", origin_input_ids=[5, 6, 7])
    assert identities([req])[0].prompt_hash == join_keys.prompt_hash([5, 6, 7])


def test_a_failure_of_ours_leaves_the_forward_alone(caplog, monkeypatch):
    """Our begin() raising: the forward runs once with its arguments, returns its result; one warning, then debug."""

    class Broken:
        def begin(self, model, forward_batch):
            raise RuntimeError("boom")

    monkeypatch.setattr(patching, "_failures_reported", set())
    wrapper = sglang_model_runner.forward_wrapper(patching.PatchContext("sglang.model_runner", "0.5.2", None))
    caplog.set_level(logging.DEBUG, logger="msprobe_hooks")
    ours = logging.getLogger("msprobe_hooks")
    monkeypatch.setattr(ours, "handlers", [caplog.handler])  # ours does not propagate to caplog's root handler
    monkeypatch.setattr(ours, "propagate", False)
    calls = []
    instance = SimpleNamespace(_msprobe_hooks_runner=Broken(), model=None)

    def forward(forward_batch, **kwargs):
        calls.append((forward_batch, kwargs))
        return "logits"

    for _ in range(2):
        assert wrapper(forward, instance, ("batch",), {"pp_proxy_tensors": None}) == "logits"
    assert calls == [("batch", {"pp_proxy_tensors": None})] * 2
    ours = [r for r in caplog.records if "boom" in r.getMessage()]
    assert [r.levelno for r in ours] == [logging.WARNING, logging.DEBUG]
