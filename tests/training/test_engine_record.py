"""engine.jsonl (the training engine's numerics, once per process) and the configuration fingerprint both sides write.

The engines here are stand-ins holding real objects: a tiny HF Qwen2 (its configuration, parameters, rotary
module and output layer), torch's own FSDP2 ``MixedPrecisionPolicy`` where ``fully_shard`` keeps it
(``_get_fsdp_state()._mp_policy``), verl's ``_autocast_dtype``. The real FSDP2 engine is read in
``test_verl_fsdp_gap.py``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy
from transformers import Qwen2Config, Qwen2ForCausalLM

from msprobe_hooks import join_keys, numerics
from msprobe_hooks.log import NAME as LOGGER
from msprobe_hooks.training import engine_record


def _config(**overrides) -> Qwen2Config:
    settings = {
        "vocab_size": 64,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
        "rms_norm_eps": 1e-5,
        **overrides,
    }
    return Qwen2Config(**settings)


def _fsdp_engine(policy: MixedPrecisionPolicy | None, autocast: torch.dtype, config: Qwen2Config | None = None):
    """An FSDP engine as verl's: ``module`` the HF model (fp32 parameters), its FSDP2 policy, verl's autocast."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config or _config())
    model.config._attn_implementation = "eager"
    if policy is not None:
        model._get_fsdp_state = lambda: SimpleNamespace(_mp_policy=policy)
    return SimpleNamespace(
        module=model,
        _autocast_dtype=autocast,
        use_remove_padding=True,
        ulysses_sequence_parallel_size=1,
        model_config=SimpleNamespace(hf_config=model.config),
    )


def _first_forward(log: engine_record.EngineLog, engine, name: str = engine_record.FSDP) -> None:
    """What the patch does around the process's first actor forward: watch, forward as verl's forward_step
    (under autocast unless float32), write with the forward's result (log-probs in float32, as verl's)."""
    log.watch(name, engine)
    autocast = engine._autocast_dtype
    with torch.no_grad(), torch.autocast("cpu", dtype=autocast, enabled=autocast != torch.float32):
        engine.module(input_ids=torch.tensor([[1, 2, 3]]))
    result = (torch.tensor(1.0), {"model_output": {"log_probs": torch.zeros(3, dtype=torch.float32)}})
    log.write(None, name, engine, result)


def _lines(root) -> list[dict]:
    return [
        json.loads(line) for path in root.glob(f"*/{join_keys.ENGINE_LOG}") for line in path.read_text().splitlines()
    ]


@pytest.fixture
def warnings(caplog) -> Iterator[Callable[[], list[str]]]:
    log = logging.getLogger(LOGGER)
    saved = log.handlers[:], log.propagate
    log.handlers, log.propagate = [caplog.handler], False
    yield lambda: [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    log.handlers, log.propagate = saved


def test_the_fsdp_line_is_what_the_engine_computes_in_not_what_its_weights_are(tmp_path, warnings):
    # fp32 weights, verl's FSDP default policy (bf16 compute, fp32 reduce) and autocast: the forward is bf16.
    engine = _fsdp_engine(MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32), torch.bfloat16)
    log = engine_record.EngineLog(lambda cfg: str(tmp_path))
    _first_forward(log, engine)
    _first_forward(log, engine)  # once per process
    [line] = _lines(tmp_path)
    assert list(line) == [
        "side",
        "engine",
        "version",
        "pid",
        "rank",
        "time",
        "numerics",
        "model_config",
        "model_config_fingerprint",
    ]
    assert (line["side"], line["engine"], line["rank"]) == ("train", "verl-fsdp", None)
    assert line["version"] == __import__("importlib.metadata").metadata.version("verl")
    assert line["numerics"] == {
        "model_dtype": "bfloat16",
        "param_dtype": "float32",
        "autocast_dtype": "bfloat16",
        "reduce_dtype": "float32",
        "attention_implementation": "eager",
        "remove_padding": True,
        "sequence_parallel": 1,
        "tensor_parallel": None,
        "pipeline_parallel": None,
        "expert_parallel": None,
        "context_parallel": None,
        "logits_dtype": "bfloat16",  # seen on lm_head's output in the forward
        "log_probs_dtype": "float32",
    }
    fields = line["model_config"]
    assert fields["rope_parameters"] == {"rope_type": "default", "rope_theta": 500000.0}
    assert (fields["rms_norm_eps"], fields["hidden_size"], fields["num_key_value_heads"]) == (1e-5, 64, 1)
    assert "torch_dtype" not in fields and "dtype" not in fields
    # The base the loaded rotary module really uses, from its inv_freq.
    assert fields["rotary"] == {
        "base": 500000.0,
        "source": "model.rotary_emb.inv_freq",
        "rope_type": "default",
        "attention_scaling": 1.0,
    }
    assert line["model_config_fingerprint"] == numerics.config_fingerprint(engine.module.config.to_dict())
    assert warnings() == []
    # The hook is gone: later forwards are the engine's own.
    assert not engine.module.get_output_embeddings()._forward_hooks


def test_without_a_policy_or_autocast_the_model_computes_in_its_parameters_dtype(tmp_path):
    # FSDP2's default policy casts nothing (param_dtype None); verl runs no autocast when its dtype is float32.
    engine = _fsdp_engine(MixedPrecisionPolicy(), torch.float32)
    log = engine_record.EngineLog(lambda cfg: str(tmp_path))
    _first_forward(log, engine)
    numerics = _lines(tmp_path)[0]["numerics"]
    assert (numerics["model_dtype"], numerics["param_dtype"], numerics["autocast_dtype"]) == (
        "float32",
        "float32",
        None,
    )
    assert (numerics["reduce_dtype"], numerics["logits_dtype"]) == (None, "float32")


def test_a_scaled_rope_shows_in_the_rotary_modules_base():
    # Linear scaling by 4 divides every frequency by 4: the loaded module's base is no longer rope_theta.
    scaled = _config(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})
    model = Qwen2ForCausalLM(scaled)
    rotary = engine_record.rotary(model.named_modules())
    assert rotary["rope_type"] == "linear" and rotary["base"] != pytest.approx(10000.0, rel=1e-3)
    assert engine_record.rotary(Qwen2ForCausalLM(_config()).named_modules())["base"] == 500000.0


def test_a_broken_config_gives_nulls_and_one_line_never_an_exception(tmp_path, warnings):
    class Broken(Qwen2Config):
        @property
        def rms_norm_eps(self):  # noqa: D401
            raise RuntimeError("config lost its eps")

        def to_dict(self):
            raise RuntimeError("no dict")

    engine = _fsdp_engine(None, torch.float32)
    broken = _config()
    broken.__class__ = Broken  # after its __init__, which sets the field
    engine.module.config = broken
    del engine.ulysses_sequence_parallel_size  # an engine without the setting: null too
    log = engine_record.EngineLog(lambda cfg: str(tmp_path))
    _first_forward(log, engine)
    [line] = _lines(tmp_path)
    assert line["model_config"]["rms_norm_eps"] is None
    assert line["model_config"]["hidden_size"] == 64  # the rest is still read
    assert line["model_config_fingerprint"] is None and line["numerics"]["sequence_parallel"] is None
    [warned] = warnings()
    assert warned.startswith("engine.jsonl of the verl-fsdp engine: could not read ")
    assert "rms_norm_eps (RuntimeError: config lost its eps)" in warned and "no dict" in warned
    assert "sequence_parallel (AttributeError" in warned


def test_an_engine_without_an_output_layer_still_gets_its_line(tmp_path, warnings):
    engine = _fsdp_engine(None, torch.float32)
    engine.module.get_output_embeddings = lambda: None  # register_forward_hook on None raises
    log = engine_record.EngineLog(lambda cfg: str(tmp_path))
    _first_forward(log, engine)
    [line] = _lines(tmp_path)
    assert line["numerics"]["logits_dtype"] is None and line["numerics"]["model_dtype"] == "float32"
    assert "logits_dtype (AttributeError" in warnings()[0]


def test_the_megatron_line_reads_the_transformer_config_and_the_chunks(tmp_path):
    model = Qwen2ForCausalLM(_config()).to(torch.bfloat16)
    output_layer = torch.nn.Linear(64, 64, dtype=torch.bfloat16)  # megatron-core's output layer, in the GPTModel
    chunk = torch.nn.ModuleDict({"model": model, "output_layer": output_layer})
    chunk.ddp_config = SimpleNamespace(grad_reduce_in_fp32=True)
    tf = SimpleNamespace(
        bf16=True,
        fp16=False,
        params_dtype=torch.bfloat16,
        attention_backend=SimpleNamespace(name="local"),
        sequence_parallel=False,
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=1,
        expert_model_parallel_size=1,
        context_parallel_size=1,
    )
    engine = SimpleNamespace(
        module=[chunk],
        tf_config=tf,
        engine_config=SimpleNamespace(use_remove_padding=False),
        model_config=SimpleNamespace(hf_config=model.config),
        _autocast_dtype=torch.float32,
    )
    log = engine_record.EngineLog(lambda cfg: str(tmp_path))
    log.watch(engine_record.MEGATRON, engine)
    with torch.no_grad():
        output_layer(torch.zeros(2, 64, dtype=torch.bfloat16))
    log.write(
        None, engine_record.MEGATRON, engine, (torch.tensor(1.0), {"model_output": {"log_probs": torch.zeros(2)}})
    )
    line = _lines(tmp_path)[0]
    assert line["engine"] == "verl-megatron"
    assert line["numerics"] == {
        "model_dtype": "bfloat16",
        "param_dtype": "bfloat16",
        "autocast_dtype": None,
        "reduce_dtype": "float32",
        "attention_implementation": "local",
        "remove_padding": False,
        "sequence_parallel": False,
        "tensor_parallel": 2,
        "pipeline_parallel": 1,
        "expert_parallel": 1,
        "context_parallel": 1,
        "logits_dtype": "bfloat16",
        "log_probs_dtype": "float32",
    }
    assert line["model_config"]["rotary"]["source"] == "model.model.rotary_emb.inv_freq"


# --- the fingerprint ---------------------------------------------------------------------------------


def test_the_fingerprint_is_equal_for_equal_configs_and_stable():
    first, second = _config().to_dict(), _config().to_dict()
    assert numerics.config_fingerprint(first) == numerics.config_fingerprint(second)
    assert numerics.config_fingerprint(first).startswith("cfg-v1:") and len(numerics.config_fingerprint(first)) == 71
    reordered = dict(reversed(list(first.items())))
    assert numerics.config_fingerprint(reordered) == numerics.config_fingerprint(first)


@pytest.mark.parametrize(
    "change",
    [
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
        {"rms_norm_eps": 1e-6},
        {"sliding_window": 16, "use_sliding_window": True},
        {"tie_word_embeddings": True},
    ],
    ids=["rope_theta", "rms_norm_eps", "sliding_window", "tie_word_embeddings"],
)
def test_a_numerics_field_changes_the_fingerprint(change):
    assert numerics.config_fingerprint(_config(**change).to_dict()) != numerics.config_fingerprint(_config().to_dict())


def test_fields_that_say_how_a_config_was_loaded_leave_the_fingerprint_alone():
    base = _config().to_dict()
    loaded = {
        **base,
        "dtype": "bfloat16",
        "torch_dtype": "float32",
        "_name_or_path": "/elsewhere",
        "architectures": ["Other"],
        "transformers_version": "4.0",
        "use_cache": not base.get("use_cache", True),
        "_attn_implementation": "sdpa",
        "pad_token_id": 7,  # verl sets the token ids from the tokenizer
    }
    assert numerics.config_fingerprint(loaded) == numerics.config_fingerprint(base)
    # At every level: a multi-modal configuration's text part too.
    nested = {"text_config": base}
    assert numerics.config_fingerprint({"text_config": loaded}) == numerics.config_fingerprint(nested)
    changed = {"text_config": {**base, "rms_norm_eps": 1e-3}}
    assert numerics.config_fingerprint(changed) != numerics.config_fingerprint(nested)
