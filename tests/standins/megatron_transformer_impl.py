"""Stand-in for ``verl.workers.engine.megatron.transformer_impl`` (verl >= 0.8 signatures).

The real module runs here only as the CPU kit can build it (BSHD, one model chunk per rank, no MoE;
``tests/training/test_real_megatron.py``). For the rest (``test_verl_megatron_standin.py``: THD packing,
middle pipeline stages, the log-prob gap's sources) this module has the classes, methods, signatures and
attributes the ``verl.megatron_engine`` patch relies on (checked against the patch's contract by the
tests), and drives them as Megatron's no-pipelining schedule drives verl's callbacks: per micro-batch,
``forward_step_func(data_iterator, model)`` returns the output and a loss function (verl's
``postprocess_micro_batch_func`` bound to the micro-batch), the schedule calls it and, when
training, runs the backward from the returned loss. The model chunks are small real torch
modules, so msprobe really dumps them. Micro-batches are verl's own TensorDicts, and the engine
classes derive from verl's ``BaseEngine`` as the real ones do.

``MegatronEngineWithLMHead.forward_step`` reads the micro-batch as verl's does where the patch's
prompt-only micro-batches depend on it: ``loss_mask`` may be no longer than ``input_ids`` (verl's
MTP loss-mask builders assert it), ``forced_max_seqlen`` pads the input (verl 0.9's BSHD path).
Its ``postprocess_micro_batch_func`` returns what verl's does where the log-prob gap reads it:
``model_output["log_probs"]``, jagged as ``input_ids``, entry ``t`` the log-prob of token ``t + 1``
(here among the chunk's ``hidden`` outputs, the token id taken modulo their number).
"""

from __future__ import annotations

from functools import partial

import torch
from verl.utils import tensordict_utils as tu
from verl.workers.engine.base import BaseEngine  # verl's other engines (MindSpeed) register subclasses


class _ParallelState:
    """Stands for ``megatron.core.parallel_state``, imported by the real module as ``mpu``."""

    last_stage = True

    def is_pipeline_last_stage(self, ignore_virtual: bool = False) -> bool:
        return self.last_stage


mpu = _ParallelState()


def make_chunk(seed: int = 0, vocab: int = 128, hidden: int = 16) -> torch.nn.Module:
    torch.manual_seed(seed)
    # msprobe skips the first and the last submodule when verl is imported: two more in between.
    layers = [torch.nn.Linear(hidden, hidden) for _ in range(3)]
    return torch.nn.Sequential(torch.nn.Embedding(vocab, hidden), *layers)


class MegatronEngine(BaseEngine):
    def __init__(self, engine_config, chunks: list[torch.nn.Module]):
        self.engine_config = engine_config
        self.module = chunks
        self.enable_routing_replay = self.engine_config.router_replay.mode != "disabled"

    def get_data_parallel_group(self):
        return torch.distributed.group.WORLD if torch.distributed.is_initialized() else None

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        size = tu.get_non_tensor_data(data, "micro_batch_size_per_gpu", 1)
        starts = range(0, len(data), size)
        micro_batches = [tu.index_select_tensor_dict(data, list(range(i, min(i + size, len(data))))) for i in starts]
        postprocess = partial(self.postprocess_micro_batch_func, forward_only=forward_only, loss_function=loss_function)
        forward_step = partial(
            self.forward_step, logits_processor_func=loss_function, postprocess_micro_batch_func=postprocess
        )
        data_iterator = iter(micro_batches)
        outputs = []
        for _ in micro_batches:
            output, loss_func = forward_step(data_iterator, self.module[0])
            loss, meta = loss_func(output)
            if not forward_only:
                loss.backward()
            outputs.append(meta)
        return outputs

    def forward_step(self, batch_iter, model, logits_processor_func, postprocess_micro_batch_func):
        raise NotImplementedError

    def postprocess_micro_batch_func(self, output, data, forward_only, loss_function):
        raise NotImplementedError


class MegatronEngineWithLMHead(MegatronEngine):
    def forward_step(self, batch_iter, model, logits_processor_func, postprocess_micro_batch_func):
        batch = next(batch_iter)
        input_ids, loss_mask = batch["input_ids"], batch["loss_mask"].to(bool)
        for ids, mask in zip(input_ids.unbind(), loss_mask.unbind(), strict=True):
            assert mask.shape[-1] <= ids.shape[-1], "loss_mask cannot be longer than input_ids"
        forced_max_seqlen = tu.get_non_tensor_data(batch, "forced_max_seqlen", None)
        if forced_max_seqlen is None:  # THD: the samples packed into one row
            output = model(input_ids.values().unsqueeze(0))
        else:  # BSHD: one row per sample, padded to the mini-batch's longest
            output = model(torch.nested.to_padded_tensor(input_ids, 0, output_size=(len(batch), forced_max_seqlen)))
        return output, partial(postprocess_micro_batch_func, data=batch)

    def postprocess_micro_batch_func(self, output, data, forward_only, loss_function, local_cp_size=None):
        loss = output.pow(2).mean() if loss_function is not None else torch.tensor(1.0)
        return loss, {"loss": float(loss.detach()), "model_output": self.prepare_model_outputs(output.detach(), data)}

    def prepare_model_outputs(self, output, data):
        input_ids = data["input_ids"]
        lengths = input_ids.offsets().diff().tolist()
        rows = (
            output[0] if output.shape[0] == 1 else torch.cat([row[:n] for row, n in zip(output, lengths, strict=True)])
        )
        labels = torch.roll(input_ids.values(), -1) % rows.shape[-1]
        log_probs = rows.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return {"log_probs": torch.nested.nested_tensor_from_jagged(log_probs, input_ids.offsets())}


class MegatronEngineWithValueHead(MegatronEngineWithLMHead):
    def forward_step(self, batch_iter, model, logits_processor_func, postprocess_micro_batch_func):
        batch = next(batch_iter)
        values = model(batch["input_ids"].values().unsqueeze(0)).sum(-1)
        return values, partial(postprocess_micro_batch_func, data=batch)

    def prepare_model_outputs(self, output, data):
        return {"values": output}
