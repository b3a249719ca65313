"""The evidence an SGLang runner records beside its dispatch log: engine.jsonl and requests.jsonl, in-process.

A ModelRunner class and the batches are stood in by plain objects shaped like SGLang 0.5.21's (the runner's
``model_config``, resolved ``server_args``, parallel sizes, a loaded model with a logits processor and a rotary
module; ``Req`` objects with ``sampling_params``), patched by the real ``sglang.model_runner`` and
``sglang.forward_batch`` patches; the files are then read back by ``align`` and ``compare`` beside the golden SGLang
tree. The real CPU engine writes them in test_real_sglang.py.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
from support import golden
from torch import nn

from msprobe_hooks import config as config_module
from msprobe_hooks import jsonl, numerics, patching
from msprobe_hooks.analysis.answer.evidence import TEMPERATURE
from msprobe_hooks.analysis.results import Cause, DiagnosisPath
from msprobe_hooks.analysis.run import CompareOptions, compare_file
from msprobe_hooks.cli import main
from msprobe_hooks.join_keys import ENGINE_LOG, GAP_LOG, REQUESTS_LOG
from msprobe_hooks.numerics import NUMERICS_KEYS, config_fields, config_fingerprint
from msprobe_hooks.patches.sglang import forward_batch as sglang_forward_batch
from msprobe_hooks.patches.sglang import model_runner as sglang_model_runner
from msprobe_hooks.patches.sglang.evidence import describe_engine

CHECKPOINT = {
    "_name_or_path": "/models/qwen",
    "model_type": "qwen2",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "vocab_size": 128,
    "rope_theta": 10000.0,
}
TOP_K_ALL = 1 << 30  # SGLang's top_k when the whole vocabulary is kept


class HFConfig:
    def __init__(self, fields: dict) -> None:
        self.fields = fields

    def to_dict(self) -> dict:
        return dict(self.fields)


class Rotary(nn.Module):
    def __init__(self, base: float) -> None:
        super().__init__()
        self.base, self.rotary_dim = base, 32


class Model(nn.Module):
    """Two layers sharing one rotary module; a logits processor that says whether its lm_head runs in fp32."""

    def __init__(self, fp32_lm_head: bool) -> None:
        super().__init__()
        rotary = Rotary(10000.0)
        self.layers = nn.ModuleList(nn.ModuleDict({"rotary_emb": rotary}) for _ in range(2))
        self.logits_processor = nn.Module()
        self.logits_processor.use_fp32_lm_head = fp32_lm_head


def server_args(**changes: object) -> SimpleNamespace:
    """A resolved ServerArgs' fields the engine line reads, as SGLang 0.5.21 on CPU resolves them."""
    fields = {
        "kv_cache_dtype": "auto",
        "attention_backend": "torch_native",
        "disable_radix_cache": False,
        "chunked_prefill_size": 8,
        "disable_cuda_graph": True,
        "disable_piecewise_cuda_graph": True,
        "enable_torch_compile": False,
    }
    return SimpleNamespace(**{**fields, **changes})


def graphs(**backends: str) -> SimpleNamespace:
    """A resolved CudaGraphConfig: each phase's backend."""
    return SimpleNamespace(**{phase: SimpleNamespace(backend=backend) for phase, backend in backends.items()})


def runner_class(model: nn.Module, args: SimpleNamespace, model_config: SimpleNamespace | None = None) -> type:
    """A ModelRunner whose ``__init__`` loads ``model``, as SGLang's does, patched by the real patch."""

    class ModelRunner:
        def __init__(self, model_config, mem_fraction_static, gpu_id, tp_rank=0, server_args=None):
            self.model_config = model_config
            self.server_args = server_args
            self.gpu_id, self.tp_size, self.pp_size, self.moe_ep_size = gpu_id, 2, 1, 2
            self.model = model

        def forward(self, forward_batch):
            return "logits"

    return ModelRunner


def sglang_config(hf: dict | None = None, **changes: object) -> SimpleNamespace:
    hf_config = HFConfig(hf or CHECKPOINT)
    fields = {"dtype": torch.bfloat16, "quantization": None, "context_len": 256}
    return SimpleNamespace(hf_config=hf_config, hf_text_config=hf_config, **{**fields, **changes})


@pytest.fixture
def sampler(monkeypatch):
    """SGLang's sampler module, with its switch for the log-probs of the raw logits (off: SGLang's default)."""
    module = ModuleType("sglang.srt.layers.sampler")
    module.SGLANG_RETURN_ORIGINAL_LOGPROB = False
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


class Engine:
    """A patched ModelRunner and ForwardBatch.init_new over stand-in classes, writing under ``root``."""

    def __init__(self, root: Path, model: nn.Module, args: SimpleNamespace, model_config: SimpleNamespace) -> None:
        cfg = config_module.load({"MSPROBE_HOOKS_OUTPUT_DIR": str(root)})
        runners = SimpleNamespace(ModelRunner=runner_class(model, args))
        sglang_model_runner.patch(runners, patching.PatchContext("sglang.model_runner", "0.5.21", cfg))
        batches = SimpleNamespace(ForwardBatch=type("ForwardBatch", (), {"init_new": classmethod(_init_new)}))
        sglang_forward_batch.patch(batches, patching.PatchContext("sglang.forward_batch", "0.5.21", cfg))
        self.init_new = batches.ForwardBatch.init_new
        self.runner = runners.ModelRunner(model_config, 0.5, 0, server_args=args)

    def step(self, reqs: list[SimpleNamespace]) -> None:
        """One prefill forward of ``reqs`` (ModelWorkerBatch.reqs, 0.5.6-0.5.12's shape)."""
        forward_batch = self.init_new(SimpleNamespace(reqs=reqs), self.runner)
        self.runner.forward(forward_batch)


def _init_new(cls, batch, model_runner):
    lens = [len(req.origin_input_ids) for req in batch.reqs]
    return SimpleNamespace(
        forward_mode=SimpleNamespace(name="EXTEND"),
        batch_size=len(lens),
        extend_seq_lens_cpu=lens,
        extend_prefix_lens_cpu=[0] * len(lens),
        seq_lens_cpu=None,
    )


def req(rid: str, prompt: list[int], *, logprobs: int | None = 0, **sampling: object) -> SimpleNamespace:
    """An SGLang ``Req``: SamplingParams as SGLang normalises them (top_k -1 is TOP_K_ALL), logprobs asked or not."""
    fields = {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": TOP_K_ALL,
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "repetition_penalty": 1.0,
        "sampling_seed": None,
    }
    return SimpleNamespace(
        rid=rid,
        origin_input_ids=prompt,
        sampling_params=SimpleNamespace(**{**fields, **sampling}),
        return_logprob=logprobs is not None,
        top_logprobs_num=logprobs or 0,
    )


def read(root: Path, name: str) -> list[dict]:
    jsonl.flush()  # requests.jsonl's lines, handed to the writer thread
    (folder,) = [p for p in (root / "generate").iterdir() if p.is_dir()]
    path = folder / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_engine_line_says_what_the_loaded_model_runs(tmp_path, sampler, hook_warnings):
    args = server_args(kv_cache_dtype="fp8_e4m3")
    Engine(tmp_path, Model(fp32_lm_head=True), args, sglang_config({**CHECKPOINT, "rope_theta": 500000.0}))
    (line,) = read(tmp_path, ENGINE_LOG)
    assert (line["side"], line["engine"], line["version"]) == ("generate", "sglang", "0.5.21")
    assert isinstance(line["pid"], int) and line["rank"] == 0 and isinstance(line["time"], float)
    assert list(line["numerics"]) == list(NUMERICS_KEYS)
    assert line["numerics"] == {
        "model_dtype": "bfloat16",
        "kv_cache_dtype": "fp8_e4m3",
        "head_dtype": "float32",  # --enable-fp32-lm-head, as the logits processor applies it
        "attention_backend": "torch_native",
        "tensor_parallel": 2,
        "pipeline_parallel": 1,
        "expert_parallel": 2,
        "prefix_caching": True,
        "chunked_prefill": True,
        "eager": True,
        "quantization": None,
        "logprobs_mode": numerics.TEMPERATURE_SCALED_LOGPROBS,  # SGLang's default: log_softmax(logits / T)
        "max_model_len": 256,
    }
    checkpoint = {**CHECKPOINT, "rope_theta": 500000.0}
    # the rotary modules' base, not the config's
    assert line["model_config"] == {
        **config_fields(checkpoint),
        "rope_theta": 10000.0,
        "rope_theta_source": "rotary module",
    }
    assert line["model_config_fingerprint"] == config_fingerprint(checkpoint)
    assert hook_warnings() == []


@pytest.mark.parametrize(
    ("changes", "raw", "expected"),
    [
        (
            {"disable_radix_cache": True, "chunked_prefill_size": -1, "disable_cuda_graph": False},
            True,
            {"prefix_caching": False, "chunked_prefill": False, "eager": False, "logprobs_mode": "raw_logprobs"},
        ),
        ({"disable_piecewise_cuda_graph": False}, False, {"eager": False}),  # piecewise graphs (0.5.10+)
        ({"enable_torch_compile": True}, False, {"eager": False}),
        # 0.5.21's resolved per-phase graphs say it, whatever the legacy switch
        ({"cuda_graph_config": graphs(decode="full", prefill="disabled")}, False, {"eager": False}),
        ({"cuda_graph_config": graphs(decode="disabled", prefill="disabled")}, False, {"eager": True}),
        ({"chunked_prefill_size": None}, False, {"chunked_prefill": False}),
    ],
)
def test_switches_off_and_the_raw_log_probs_switch(tmp_path, sampler, changes, raw, expected):
    sampler.SGLANG_RETURN_ORIGINAL_LOGPROB = raw
    Engine(tmp_path, Model(fp32_lm_head=False), server_args(**changes), sglang_config())
    (line,) = read(tmp_path, ENGINE_LOG)
    assert {key: line["numerics"][key] for key in expected} == expected
    assert (line["numerics"]["head_dtype"], line["numerics"]["kv_cache_dtype"]) == ("bfloat16", "bfloat16")


def test_a_setting_unread_gives_null_and_one_log_line_never_an_exception(tmp_path, sampler, hook_warnings):
    class Args(SimpleNamespace):
        @property
        def kv_cache_dtype(self):
            raise RuntimeError("unresolved")

    args = Args(**{k: v for k, v in vars(server_args()).items() if k != "kv_cache_dtype"})
    del args.attention_backend  # a release without it: null, and no word about it
    model = Model(fp32_lm_head=False)
    del model.logits_processor
    Engine(tmp_path, model, args, sglang_config())
    (line,) = read(tmp_path, ENGINE_LOG)
    assert line["numerics"]["kv_cache_dtype"] is None and line["numerics"]["attention_backend"] is None
    assert line["numerics"]["head_dtype"] is None
    assert line["numerics"]["model_dtype"] == "bfloat16"  # the rest is still read
    (warned,) = hook_warnings()
    assert warned == f"{ENGINE_LOG}: could not read kv_cache_dtype (RuntimeError: unresolved); written as null"


def test_a_runner_with_few_of_the_settings_writes_nulls_without_a_word(tmp_path, monkeypatch, hook_warnings):
    """A release (or the stand-ins) with no model_config, no such ServerArgs fields, no sampler module loaded."""
    monkeypatch.delitem(sys.modules, "sglang.srt.layers.sampler", raising=False)
    engine = Engine(tmp_path, nn.Linear(2, 2), SimpleNamespace(), sglang_config())
    del engine.runner.model_config, engine.runner.moe_ep_size
    describe_engine(engine.runner._msprobe_hooks_runner, engine.runner)  # described again, without them
    first, bare = read(tmp_path, ENGINE_LOG)
    assert first["numerics"]["logprobs_mode"] is None
    assert bare["numerics"] == {**dict.fromkeys(NUMERICS_KEYS), "tensor_parallel": 2, "pipeline_parallel": 1}
    assert (bare["model_config"], bare["model_config_fingerprint"]) == ({}, None)
    assert hook_warnings() == []


def test_one_request_line_per_request_when_a_batch_first_holds_it(tmp_path, sampler):
    engine = Engine(tmp_path, Model(fp32_lm_head=False), server_args(), sglang_config())
    a = req("req-a", [1, 2, 3], temperature=0.8, top_p=0.9, sampling_seed=7)
    b = req("req-b", [4, 5], logprobs=None, top_k=20, min_p=0.05, repetition_penalty=1.1)
    engine.step([a])
    engine.step([a, b])  # a again (a decode, a chunk): not written again
    engine.step([a, b])
    lines = read(tmp_path, REQUESTS_LOG)
    assert [(r["request_id"], r["base"], r["prompt_len"], r["prompt_token_ids"]) for r in lines] == [
        ("req-a", "req-a", 3, [1, 2, 3]),
        ("req-b", "req-b", 2, [4, 5]),
    ]
    assert [list(r["sampling"]) for r in lines] == [list(numerics.SAMPLING_KEYS)] * 2
    assert lines[0]["sampling"] == {
        "temperature": 0.8,
        "top_k": TOP_K_ALL,
        "top_p": 0.9,
        "min_p": 0.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "logprobs": 0,  # return_logprob, no top log-probs
        "seed": 7,
    }
    assert lines[1]["sampling"] == {
        **lines[0]["sampling"],
        **{"temperature": 1.0, "top_p": 1.0, "seed": None},
        **{"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "logprobs": None},  # no log-probs asked
    }
    assert len(read(tmp_path, ENGINE_LOG)) == 1  # once per runner, not per forward


def test_the_records_are_read_back_by_compare(tmp_path, sampler):
    """SGLang's default log-probs at temperature 0.8 against a trainer at 1.0: sampling; its top_p is not part of
    what SGLang returns, so it is not named."""
    train, generate = tmp_path / "actor", tmp_path / "generate"
    shutil.copytree(golden.GOLDEN / "fsdp2" / "actor", train)
    shutil.copytree(golden.GOLDEN / "sglang" / "generate", generate)
    (train_process,) = [p for p in train.iterdir() if p.name.isdigit()]
    (generate_process,) = [p for p in generate.iterdir() if p.name.isdigit()]
    written = tmp_path / "written"
    engine = Engine(written, Model(fp32_lm_head=False), server_args(), sglang_config(dtype=torch.float32))
    engine.step([req(key, ids, temperature=0.8, top_p=0.9) for key, ids in golden.PROMPTS.items()])
    jsonl.flush()
    for name in (ENGINE_LOG, REQUESTS_LOG):  # into the golden engine's process folder
        (folder,) = [p for p in (written / "generate").iterdir() if p.is_dir()]
        shutil.copy(folder / name, generate_process / name)
    training = {
        "side": "train", "engine": "verl-fsdp", "version": "0", "pid": 1, "rank": 0, "time": 0.0,
        "numerics": {"model_dtype": "float32", "logits_dtype": "float32"},
        "model_config": config_fields(CHECKPOINT), "model_config_fingerprint": config_fingerprint(CHECKPOINT),
    }  # fmt: skip
    (train_process / ENGINE_LOG).write_text(json.dumps(training) + "\n")
    gaps = [
        {"request_id": key, "global_step": 1, "tokens": 2, "max": 0.0, "mean": 0.0, "temperature": 1.0,
         "prompt_len": len(ids), "token_ids": [*ids, 1, 2]}
        for key, ids in golden.PROMPTS.items()
    ]  # fmt: skip
    (train_process / GAP_LOG).write_text("".join(json.dumps(g) + "\n" for g in gaps))
    pairs = tmp_path / "pairs.jsonl"
    assert main(["align", str(train), str(generate), "-o", str(pairs)]) == 0
    pair = json.loads(pairs.read_text().splitlines()[0])
    # named relative to the pairs file
    assert tmp_path / pair["generate"]["engine_log"] == generate_process / ENGINE_LOG
    assert tmp_path / pair["generate"]["requests_log"] == generate_process / REQUESTS_LOG
    found = compare_file(str(pairs), str(tmp_path / "report"), CompareOptions(jobs=1)).answer.diagnosis
    assert (found.cause, found.path) == (Cause.SAMPLING, DiagnosisPath.AFTER_LOGITS)
    assert found.evidence[0] == f"{TEMPERATURE} 0.8 (rollout) vs 1.0 (training)"
    assert not [e for e in found.evidence if e.startswith("top_p")]
    assert any(e.startswith(f"the rollout returns {numerics.TEMPERATURE_SCALED_LOGPROBS}") for e in found.evidence)
