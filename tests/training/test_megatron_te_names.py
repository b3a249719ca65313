"""The name map on Megatron's TransformerEngine layer spec, which cannot run on a CPU (TE needs CUDA).

The spec is megatron-core's own (``get_gpt_layer_with_transformer_engine_spec``, megatron-core 0.16.1 from
``make install-megatron``), built with classes named as TransformerEngine's: its backend provider,
``TESpecProvider``, is the only part that imports TE, and stands here for one returning classes of the
same names. From the spec come the module paths and classes msprobe would dump for a TE layer; the test
maps each of them as ``compare`` does. What it proves: the names of the TE spec; what only a GPU run
would: that TE's modules dump the tensors their names suggest (input 0 of ``TELayerNormColumnParallelLinear``
is the stream before its fused norm, as megatron-core's own code feeds it).
"""

from __future__ import annotations

import dataclasses

import pytest

from msprobe_hooks.analysis.comparing import names

pytestmark = pytest.mark.engine  # needs megatron-core (the real Megatron tier's install)

PREFIX = "Module.0.module.module.decoder.layers.3."
TENSOR = {"type": "torch.Tensor", "dtype": "torch.bfloat16", "shape": [6, 1, 128], "Max": 1.0, "Min": -1.0}


def _te_spec(monkeypatch: pytest.MonkeyPatch):
    import torch
    from megatron.core.models.backends import BackendSpecProvider
    from megatron.core.models.gpt import gpt_layer_specs

    def named(name: str) -> type:
        return type(name, (torch.nn.Module,), {})

    class TENamed(BackendSpecProvider):
        def column_parallel_linear(self) -> type:
            return named("TEColumnParallelLinear")

        def row_parallel_linear(self) -> type:
            return named("TERowParallelLinear")

        def fuse_layernorm_and_linear(self) -> bool:
            return True

        def column_parallel_layer_norm_linear(self) -> type:
            return named("TELayerNormColumnParallelLinear")

        def layer_norm(self, rms_norm: bool = False, for_qk: bool = False) -> type:
            return named("TENorm")

        def core_attention(self) -> type:
            return named("TEDotProductAttention")

        def grouped_mlp_modules(self, *args, **kwargs):
            raise AssertionError("a dense model's spec has no grouped experts")

        def activation_func(self) -> type:
            return named("TEActivationOp")

    monkeypatch.setattr(gpt_layer_specs, "TESpecProvider", TENamed, raising=False)
    return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec()


def _modules(spec, path: str = "") -> dict[str, str]:
    """{dotted path in a TransformerLayer: class name} of every module a ModuleSpec builds."""
    module = getattr(spec, "module", spec)
    found = {path: module.__name__} if path else {}
    submodules = getattr(spec, "submodules", None)
    if submodules is not None and dataclasses.is_dataclass(submodules):
        for field in dataclasses.fields(submodules):
            value = getattr(submodules, field.name)
            if isinstance(value, type) or hasattr(value, "module"):
                found.update(_modules(value, f"{path}.{field.name}" if path else field.name))
    return found


def _mapped(path: str, cls: str) -> dict[str, list | str]:
    """What compare makes of an entry with one input and one output: label -> keys, or its reason."""
    name = names.parse(f"{PREFIX}{path}.{cls}.forward.0")
    assert name is not None, path
    entry = {"input_args": [dict(TENSOR)], "input_kwargs": {}, "output": [dict(TENSOR)]}
    return {m.label: m.reason or sorted(m.keys) for m in names.map_entry(name, entry)}


def test_the_transformer_engine_spec_maps_to_the_inference_names(monkeypatch):
    modules = _modules(_te_spec(monkeypatch))
    assert modules["self_attention.linear_qkv"] == modules["mlp.linear_fc1"] == "TELayerNormColumnParallelLinear"
    assert modules["input_layernorm"] == modules["pre_mlp_layernorm"] == "IdentityOp"  # fused into the linears
    qkv = _mapped("self_attention.linear_qkv", modules["self_attention.linear_qkv"])
    # The fused linear's output is vLLM's qkv_proj output; its input, before the norm, is the norm's input.
    assert qkv["output.0"] == [("layers.3.self_attn.qkv_proj", "output")]
    assert qkv["input.0"] == [("layers.3.input_layernorm", "input")]
    fc1 = _mapped("mlp.linear_fc1", modules["mlp.linear_fc1"])
    assert fc1["output.0"] == [("layers.3.mlp.gate_up_proj", "output")]
    assert fc1["input.0"] == [("layers.3.post_attention_layernorm", "input")]
    for norm in ("input_layernorm", "pre_mlp_layernorm"):
        assert all(isinstance(v, str) and "identity" in v for v in _mapped(norm, modules[norm]).values())
    assert _mapped("self_attention.core_attention", modules["self_attention.core_attention"])["output.0"] == [
        ("layers.3.self_attn.attn", "output")
    ]
    proj = _mapped("self_attention.linear_proj", modules["self_attention.linear_proj"])
    assert proj["output.0"] == [("layers.3.self_attn.o_proj", "output")]
    fc2 = _mapped("mlp.linear_fc2", modules["mlp.linear_fc2"])
    assert fc2["output.0"] == [("layers.3.mlp.down_proj", "output")]


def test_the_local_specs_linears_keep_their_inputs(monkeypatch):
    # The same module paths under the local spec (the one that runs here): the linears' inputs are after the
    # norm, so they are the inference linears' inputs; the fused-norm rule is for TE's class only.
    from megatron.core.models.gpt import gpt_layer_specs

    modules = _modules(gpt_layer_specs.get_gpt_layer_local_spec())
    assert modules["self_attention.linear_qkv"] == "ColumnParallelLinear"
    qkv = _mapped("self_attention.linear_qkv", modules["self_attention.linear_qkv"])
    assert qkv["input.0"] == [("layers.3.self_attn.qkv_proj", "input")]
