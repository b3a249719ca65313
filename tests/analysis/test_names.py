"""The name map on entries as the real engines dump them (``msprobe_hooks/analysis/comparing/names.py``)."""

from __future__ import annotations

from msprobe_hooks.analysis.comparing import names


def _tensor(dtype: str, *shape: int) -> dict:
    return {"type": "torch.Tensor", "dtype": dtype, "shape": list(shape), "Max": 1.0, "Min": 0.0, "Norm": 1.0}


def test_sglang_whole_decoder_stack_is_not_comparable():
    """SGLang 0.5.21 dumps ``Module.model.Qwen2Model`` (ids, positions, forward batch -> the final norm's
    output); msprobe skips a model's first child on the training side under verl, so it has no counterpart."""
    name = names.parse("Module.model.Qwen2Model.forward.0")
    entry = {
        "input_args": [_tensor("torch.int64", 6), _tensor("torch.int64", 6), {"forward_mode": {}}],
        "input_kwargs": {},
        "output": [_tensor("torch.float32", 6, 128)],
    }
    mapped = list(names.map_entry(name, entry))
    assert names.load().canonical(name) == ("model", None)
    assert [m.label for m in mapped] == ["input.0", "input.1", "output.0"]
    assert all(not m.keys and m.reason == names.load().reasons["whole_model"] for m in mapped)
    # the modules inside it keep their keys
    norm = names.parse("Module.model.norm.RMSNorm.forward.0")
    (output,) = names.map_entry(norm, {"output": [_tensor("torch.float32", 6, 128)]})
    assert output.keys == [("norm", "output")]
    embed = names.parse("Module.model.embed_tokens.VocabParallelEmbedding.forward.0")
    assert names.load().canonical(embed) == ("embed_tokens", None)
