"""The evidence a vLLM runner records beside its dispatch log: engine.jsonl and requests.jsonl, in-process.

A runner is stood in by plain objects shaped like vLLM 0.32's (the configs, attention groups, a loaded model with a
logits processor and a rotary module) and stepped through the patch's own per-step function; the stand-in engine
run end to end is in test_vllm_dispatch.py, the real CPU engine in test_real_vllm.py.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from msprobe_hooks import jsonl
from msprobe_hooks.inference.dispatch_log import ScheduledRequest
from msprobe_hooks.join_keys import ENGINE_LOG, REQUESTS_LOG, prompt_hash
from msprobe_hooks.numerics import NUMERICS_KEYS, config_fields, config_fingerprint, dtype_name
from msprobe_hooks.patches.vllm.batch import scheduled_requests
from msprobe_hooks.patches.vllm.evidence import describe_engine
from msprobe_hooks.patches.vllm.model_runner import _record_step
from msprobe_hooks.patches.vllm.runner_state import VllmRunner

CHECKPOINT = {
    "_name_or_path": "/models/qwen",
    "transformers_version": "5.19.0",
    "model_type": "qwen2",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "vocab_size": 128,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "dtype": "bfloat16",
}


class HFConfig:
    def __init__(self, fields: dict) -> None:
        self.fields = fields

    def to_dict(self) -> dict:
        return dict(self.fields)


class ModelConfig:
    def __init__(self, overrides: dict | None = None, head_dtype: object = None) -> None:
        self.dtype = torch.bfloat16
        self.quantization = None
        self.logprobs_mode = "processed_logprobs"
        self.max_model_len = 256
        self.hf_config = self.hf_text_config = HFConfig({**CHECKPOINT, **(overrides or {})})
        self._head_dtype = head_dtype

    @property
    def head_dtype(self) -> torch.dtype:
        if isinstance(self._head_dtype, Exception):
            raise self._head_dtype
        return self._head_dtype or self.dtype


class Rotary(nn.Module):
    def __init__(self, base: float) -> None:
        super().__init__()
        self.base, self.rotary_dim = base, 32


class Model(nn.Module):
    """Two layers sharing one rotary module (as vLLM's get_rope caches them); a logits processor with a head dtype."""

    def __init__(self, head_dtype: torch.dtype | None = torch.float32) -> None:
        super().__init__()
        rotary = Rotary(10000.0)
        self.layers = nn.ModuleList(nn.ModuleDict({"rotary_emb": rotary}) for _ in range(2))
        self.lm_head = nn.Linear(4, 8, dtype=torch.bfloat16)
        if head_dtype is not None:
            self.logits_processor = nn.Module()
            self.logits_processor.head_dtype = head_dtype


class Backend:
    @staticmethod
    def get_name() -> str:
        return "CPU_ATTN"


def make_runner(model: nn.Module | None = None, model_config: ModelConfig | None = None) -> SimpleNamespace:
    runner = SimpleNamespace(
        model=model if model is not None else Model(),
        model_config=model_config or ModelConfig({"rope_theta": 500000.0}),  # ignored by the model: top level
        cache_config=SimpleNamespace(cache_dtype="fp8_e4m3", enable_prefix_caching=False),
        parallel_config=SimpleNamespace(
            tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=2, enable_expert_parallel=True
        ),
        scheduler_config=SimpleNamespace(enable_chunked_prefill=True),
        compilation_config=SimpleNamespace(mode=0, cudagraph_mode=SimpleNamespace(name="NONE")),
        attn_groups=[[SimpleNamespace(backend=Backend)]],
        requests={},
        input_batch=None,
    )
    runner.get_model = lambda: runner.model
    return runner


def make_state(runner: SimpleNamespace, root) -> VllmRunner:
    state = VllmRunner(runner, SimpleNamespace(generate_dump_root=str(root)))
    state.strips_suffix = True
    return state


def read(root, pid_folder: str, name: str) -> list[dict]:
    jsonl.flush()  # the dispatch log's lines, handed to the writer thread
    path = root / pid_folder / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def only_folder(root) -> str:
    (folder,) = [p.name for p in root.iterdir()]
    return folder


def test_the_engine_line_says_what_the_loaded_model_runs(tmp_path, hook_warnings):
    runner = make_runner()
    state = make_state(runner, tmp_path)
    describe_engine(state, runner)
    (line,) = read(tmp_path, only_folder(tmp_path), ENGINE_LOG)
    assert line["side"] == "generate" and line["engine"] == "vllm"
    assert isinstance(line["pid"], int) and line["rank"] == 0 and isinstance(line["time"], float)
    assert list(line["numerics"]) == list(NUMERICS_KEYS)
    assert line["numerics"] == {
        "model_dtype": "bfloat16",
        "kv_cache_dtype": "fp8_e4m3",
        "head_dtype": "float32",  # the logits processor's, not the model dtype
        "attention_backend": "CPU_ATTN",
        "tensor_parallel": 2,
        "pipeline_parallel": 1,
        "expert_parallel": 4,  # TP x DP with expert parallelism on
        "prefix_caching": False,
        "chunked_prefill": True,
        "eager": True,
        "quantization": None,
        "logprobs_mode": "processed_logprobs",
        "max_model_len": 256,
    }
    config = line["model_config"]
    # the override set rope_theta at the top level; the rotary module computes with rope_parameters' 10000
    assert (config["rope_theta"], config["rope_theta_source"]) == (10000.0, "rotary module")
    assert config["rope_parameters"] == {"rope_theta": 10000.0, "rope_type": "default"}
    assert (config["rms_norm_eps"], config["tie_word_embeddings"], config["model_type"]) == (1e-6, False, "qwen2")
    assert "_name_or_path" not in config and "dtype" not in config
    assert re.fullmatch(r"cfg-v1:[0-9a-f]{64}", line["model_config_fingerprint"])
    assert line["model_config_fingerprint"] == config_fingerprint({**CHECKPOINT, "rope_theta": 500000.0})
    assert "tokenizer_fingerprint" not in line  # a vLLM worker has no tokenizer: left out, never guessed
    assert hook_warnings() == []


def test_head_dtype_falls_back_to_the_config_then_the_lm_head_and_auto_cache_is_the_model_dtype(tmp_path):
    runner = make_runner(Model(head_dtype=None), ModelConfig(head_dtype=torch.float16))
    runner.cache_config.cache_dtype = "auto"
    state = make_state(runner, tmp_path)
    describe_engine(state, runner)
    head_dtype = ModelConfig.head_dtype
    del ModelConfig.head_dtype  # a release without head_dtype: the lm_head weight's dtype
    try:
        runner.model = Model(head_dtype=None)
        describe_engine(state, runner)
    finally:
        ModelConfig.head_dtype = head_dtype
    lines = read(tmp_path, only_folder(tmp_path), ENGINE_LOG)
    assert [line["numerics"]["head_dtype"] for line in lines] == ["float16", "bfloat16"]
    assert {line["numerics"]["kv_cache_dtype"] for line in lines} == {"bfloat16"}
    # no rotary base in a module: the config's, said so
    runner.model = nn.Module()
    describe_engine(state, runner)
    last = read(tmp_path, only_folder(tmp_path), ENGINE_LOG)[-1]["model_config"]
    assert (last["rope_theta"], last["rope_theta_source"]) == (10000.0, "config")


def test_a_broken_config_gives_null_and_one_log_line_never_an_exception(tmp_path, hook_warnings):
    runner = make_runner(Model(head_dtype=None), ModelConfig(head_dtype=ValueError("Unknown dtype: 'fp33'")))

    def broken() -> dict:
        raise RuntimeError("config unreadable")

    runner.model_config.hf_config.to_dict = broken
    runner.model_config.hf_text_config = SimpleNamespace(to_dict=broken)
    del runner.attn_groups  # a release without it: null, and no word about it
    state = make_state(runner, tmp_path)
    describe_engine(state, runner)
    (line,) = read(tmp_path, only_folder(tmp_path), ENGINE_LOG)
    assert line["numerics"]["head_dtype"] is None and line["numerics"]["attention_backend"] is None
    assert line["numerics"]["model_dtype"] == "bfloat16"  # the rest is still read
    assert line["model_config_fingerprint"] is None
    assert line["model_config"] == {"rope_theta": 10000.0, "rope_theta_source": "rotary module"}
    (warned,) = hook_warnings()
    assert warned.startswith(f"{ENGINE_LOG}: could not read ")
    assert "head_dtype (ValueError: Unknown dtype: 'fp33')" in warned
    assert "hf_config (RuntimeError: config unreadable)" in warned
    assert "attention_backend" not in warned


def new_request(rid: str, prompt: list[int] | None, **sampling) -> SimpleNamespace:
    params = SimpleNamespace(**{"temperature": 1.0, "top_k": 0, "top_p": 1.0, **sampling}) if sampling else None
    return SimpleNamespace(req_id=rid, prompt_token_ids=prompt, sampling_params=params)


class Step:
    """A scheduler output and the runner's persistent batch after ``_update_states``, for one model step."""

    def __init__(self, runner: SimpleNamespace, new: list, rows: list[tuple[str, int, int, int]]) -> None:
        # rows: (request id, scheduled tokens, computed before, prompt length), in packed order
        for request in new:
            runner.requests[request.req_id] = SimpleNamespace(prompt_token_ids=request.prompt_token_ids)
        runner.input_batch = SimpleNamespace(
            req_ids=[r[0] for r in rows],
            num_computed_tokens_cpu=np.array([r[2] for r in rows]),
            num_prompt_tokens=np.array([r[3] for r in rows]),
        )
        self.output = SimpleNamespace(
            scheduled_new_reqs=new,
            num_scheduled_tokens={r[0]: r[1] for r in rows},
            total_num_scheduled_tokens=sum(r[1] for r in rows),
        )


def run_steps(runner: SimpleNamespace, state: VllmRunner, steps: list[Step], reload_before: int | None = None) -> None:
    ctx = SimpleNamespace(config=SimpleNamespace(routing=False), guarded=lambda what, work, *args: work(*args))
    for number, step in enumerate(steps):
        if number == reload_before:
            runner.model = Model()
        _record_step(ctx, runner, state, (step.output,), {})


def test_one_request_line_per_request_and_one_engine_line_per_load(tmp_path):
    runner = make_runner()
    state = make_state(runner, tmp_path)
    a = new_request("a-0123abcd", [1, 2, 3], temperature=0.8, top_p=0.9, seed=7, logprobs=0)
    b = new_request("b-89abcdef", [4, 5], temperature=1.0)
    c = new_request("c", None)  # a prompt given as embeddings; a pooling request has no sampling parameters
    steps = [
        Step(runner, [a], [("a-0123abcd", 3, 0, 3)]),
        Step(runner, [b, c], [("a-0123abcd", 1, 3, 3), ("b-89abcdef", 2, 0, 2), ("c", 2, 0, 2)]),
        # a preempted and resumed: all its tokens again, among the cached requests, not a new one
        Step(runner, [], [("b-89abcdef", 1, 2, 2), ("a-0123abcd", 5, 0, 3)]),
        Step(runner, [], [("a-0123abcd", 1, 5, 3)]),
    ]
    run_steps(runner, state, steps, reload_before=3)
    folder = only_folder(tmp_path)
    requests = read(tmp_path, folder, REQUESTS_LOG)
    assert [(r["request_id"], r["base"], r["prompt_len"], r["prompt_token_ids"]) for r in requests] == [
        ("a-0123abcd", "a", 3, [1, 2, 3]),
        ("b-89abcdef", "b", 2, [4, 5]),
        ("c", "c", None, None),
    ]
    assert requests[0]["sampling"] == {
        "temperature": 0.8,
        "top_k": 0,
        "top_p": 0.9,
        "min_p": None,  # a parameter this engine's params lack
        "presence_penalty": None,
        "frequency_penalty": None,
        "repetition_penalty": None,
        "logprobs": 0,
        "seed": 7,
    }
    assert requests[1]["sampling"]["temperature"] == 1.0 and requests[2]["sampling"] is None
    assert all(isinstance(r["time"], float) for r in requests)
    # the first step, and the first after the model was loaded again
    assert len(read(tmp_path, folder, ENGINE_LOG)) == 2
    assert len(read(tmp_path, folder, "dispatch_log.jsonl")) == 4


def test_a_replaced_model_config_is_described_again(tmp_path):
    runner = make_runner()
    state = make_state(runner, tmp_path)
    assert not state.describes(runner)
    describe_engine(state, runner)
    assert state.describes(runner)
    runner.model_config = ModelConfig({"rope_parameters": {"rope_theta": 20000.0, "rope_type": "default"}})
    assert not state.describes(runner)  # vLLM's Worker.update_config replaces the object


def test_a_failure_while_describing_is_not_retried_at_every_step(tmp_path):
    runner = make_runner()
    runner.get_model = None  # not callable: evidence.describe_engine fails after marking the model described
    state = make_state(runner, tmp_path)
    with pytest.raises(TypeError):
        describe_engine(state, runner)
    assert state.describes(runner)


def test_the_config_fingerprint_is_canonical_and_ignores_where_the_config_was_read():
    reordered = dict(reversed(list(CHECKPOINT.items())))
    moved = {**CHECKPOINT, "_name_or_path": "/elsewhere", "transformers_version": "5.10.0"}
    assert config_fingerprint(reordered) == config_fingerprint(CHECKPOINT) == config_fingerprint(moved)
    assert config_fingerprint({**CHECKPOINT, "dtype": torch.bfloat16}) == config_fingerprint(CHECKPOINT)
    other_rope = {**CHECKPOINT, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}
    assert config_fingerprint(other_rope) != config_fingerprint(CHECKPOINT)
    assert config_fields(CHECKPOINT)["rope_theta"] == 10000.0  # transformers 5: read from rope_parameters
    assert dtype_name(torch.float8_e4m3fn) == "float8_e4m3fn" and dtype_name(None) is None


def test_steps_of_running_requests_read_as_columns_give_the_rows_read_one_by_one(tmp_path):
    runner = make_runner()
    state = make_state(runner, tmp_path)
    a, b = new_request("a-0123abcd", [1, 2, 3]), new_request("b-89abcdef", [4, 5])
    ha, hb = prompt_hash([1, 2, 3]), prompt_hash([4, 5])
    steps = [  # (new requests, rows, and what each row's new, tokens and computed must read)
        ([a, b], [("a-0123abcd", 3, 0, 3), ("b-89abcdef", 2, 0, 2)], [(True, 3, 0), (True, 2, 0)]),
        ([], [("a-0123abcd", 1, 3, 3), ("b-89abcdef", 1, 2, 2)], [(False, 1, 3), (False, 1, 2)]),
        ([], [("a-0123abcd", 1, 4, 3), ("b-89abcdef", 1, 3, 2)], [(False, 1, 4), (False, 1, 3)]),
    ]
    for new, batch, expected in steps:
        rows = scheduled_requests(runner, Step(runner, new, batch).output, state)
        want = [("a-0123abcd", "a", *expected[0], 3, ha, False), ("b-89abcdef", "b", *expected[1], 2, hb, False)]
        assert [tuple(row) for row in rows] == want and all(type(row) is ScheduledRequest for row in rows)
    # the same requests in another order, a recomputing all of its tokens after a preemption: read anew
    step = Step(runner, [], [("b-89abcdef", 1, 4, 2), ("a-0123abcd", 5, 0, 3)])
    rows = scheduled_requests(runner, step.output, state)
    assert [tuple(row) for row in rows] == [
        ("b-89abcdef", "b", False, 1, 4, 2, hb, False),
        ("a-0123abcd", "a", False, 5, 0, 3, ha, False),
    ]
    assert [row.prefill for row in rows] == [False, True]
    # a running request the runner never saw new (set up mid-run): read row by row, its prompt from the runner
    runner.requests["c-00000000"] = SimpleNamespace(prompt_token_ids=[7, 8])
    step = Step(runner, [], [("b-89abcdef", 1, 5, 2), ("c-00000000", 1, 9, 2)])
    assert [tuple(row) for row in scheduled_requests(runner, step.output, state)] == [
        ("b-89abcdef", "b", False, 1, 5, 2, hb, False),
        ("c-00000000", "c", False, 1, 9, 2, prompt_hash([7, 8]), False),
    ]


def test_new_requests_are_hashed_when_their_rows_are_read_never_on_the_step(tmp_path, monkeypatch):
    from msprobe_hooks.inference import dispatch_log

    hashed: list[list[int]] = []
    monkeypatch.setattr(dispatch_log, "prompt_hash", lambda ids: hashed.append(list(ids)) or prompt_hash(ids))
    runner = make_runner()
    state = make_state(runner, tmp_path)
    a, b = new_request("a-0123abcd", [1, 2, 3]), new_request("b-89abcdef", [4, 5])
    first = scheduled_requests(
        runner, Step(runner, [a, b], [("a-0123abcd", 3, 0, 3), ("b-89abcdef", 2, 0, 2)]).output, state
    )
    assert len(first) == 2 and hashed == []  # the step made no row: 20 us a prompt of 2,000 tokens
    del runner.requests["b-89abcdef"]  # over (a one-token request) before anything read the step's rows
    # the next step needs what they found (its rows come from what the last step's new requests are): made first
    second = scheduled_requests(runner, Step(runner, [], [("a-0123abcd", 1, 3, 3)]).output, state)
    assert hashed == [[1, 2, 3], [4, 5]]  # b's prompt as the step held it, though the runner no longer does
    assert [(row.request_id_base, row.prompt_hash) for row in first] == [
        ("a", prompt_hash([1, 2, 3])),
        ("b", prompt_hash([4, 5])),
    ]
    assert [tuple(row) for row in second] == [("a-0123abcd", "a", False, 1, 3, 3, prompt_hash([1, 2, 3]), False)]
    assert hashed == [[1, 2, 3], [4, 5]]  # once a request, however often its rows are read
