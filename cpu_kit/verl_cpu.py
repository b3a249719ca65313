"""verl's real FSDP2 training engine on CPU: a tiny random Qwen2, gloo, fp32, eager attention.

Used by the tests, the benchmarks and the README demo (``examples/cpu_demo.py``). Nothing here is
mocked: the engine classes, their micro-batch loop, input packing, loss and optimiser are verl's
own (0.9.1). What a CPU needs and verl does not provide:

* a CPU platform registered through ``verl.plugin.platform`` *before* ``verl.workers`` is
  imported (``transformer_impl`` reads the device name at import time);
* the engine classes constructed directly (verl's engine registry lists FSDP for cuda/npu only);
* FSDP2, eager attention, fp32 everywhere, no torch.compile;
* for a ref engine (``forward_only=True``) and a value-head engine, two substitutions in the
  model-building path that verl hard-codes for accelerators (see :func:`make_engine`).

The model and tokenizer are built in code under a folder of the caller's choosing; no hub access.
Call :func:`init_process` first in every process (world size 1 without torchrun).
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

VOCAB_SIZE = 128
PAD_TOKEN_ID = 0
EOS_TOKEN_ID = 1
# vLLM's CPU attention refuses head_dim 16: 32 lets the real vLLM engine load the same model folder.
HEAD_DIM = 32


def _cpu_device_module() -> types.SimpleNamespace:
    """What verl asks of ``torch.cuda``-like modules, answered for a CPU."""
    return types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 1,
        current_device=lambda: "cpu",
        set_device=lambda *a, **k: None,
        synchronize=lambda *a, **k: None,
        empty_cache=lambda: None,
        memory_allocated=lambda *a, **k: 0,
        memory_reserved=lambda *a, **k: 0,
        max_memory_allocated=lambda *a, **k: 0,
        max_memory_reserved=lambda *a, **k: 0,
        reset_peak_memory_stats=lambda *a, **k: None,
        mem_get_info=lambda *a, **k: (1 << 34, 1 << 34),
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
        get_device_capability=lambda *a, **k: (None, None),
        get_rng_state=torch.get_rng_state,
        set_rng_state=torch.set_rng_state,
    )


def register_cpu_platform() -> None:
    """Make verl see a CPU with gloo; idempotent. Must run before ``verl.workers`` is imported."""
    from verl.plugin.platform import PlatformBase, PlatformRegistry, get_platform, set_platform

    if PlatformRegistry.get("cpu") is not None and get_platform().device_name == "cpu":
        return

    @PlatformRegistry.register("cpu")
    class PlatformCPU(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = _cpu_device_module()

        def is_available(self) -> bool:
            return True

        def current_device(self):  # verl does tensor.to(current_device()): a device string works
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index=None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0):
            return (None, None)

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CPU_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

    set_platform(PlatformCPU())


def init_process() -> tuple[int, int]:
    """Register the CPU platform and start gloo (torchrun's variables, else a world of one)."""
    register_cpu_platform()
    torch.set_num_threads(1)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_model_dir(
    path: str,
    seed: int = 0,
    layers: int = 2,
    hidden: int = 64,
    *,
    heads: int | None = None,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    vocab: int = VOCAB_SIZE,
    tie_word_embeddings: bool = False,
    dtype: torch.dtype = torch.float32,
) -> str:
    """A random Qwen2 and a WordLevel tokenizer of ``vocab`` tokens, saved under ``path`` (reused if present).

    By default tiny: heads of ``HEAD_DIM``, half as many KV heads, an MLP twice the hidden size. The
    folder loads in verl's FSDP2 engine here and in the real vLLM and SGLang engines
    (``.venv-vllm``, ``.venv-sglang``; SGLang takes the tokenizer files from a folder of their own,
    see ``tests/support/real_sglang.py``), so training and inference dumps of one model can be compared.
    ``dtype`` is the dtype the weights are saved in (bfloat16 halves a large model's folder; both
    engines load it as the dtype they are asked for).
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    write_tokenizer(path, vocab)
    heads = heads or hidden // HEAD_DIM
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or max(1, heads // 2),
        max_position_embeddings=512,
        pad_token_id=PAD_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        bos_token_id=EOS_TOKEN_ID,
        tie_word_embeddings=tie_word_embeddings,
    )
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).to(dtype).save_pretrained(path, safe_serialization=True)
    return path


def write_tokenizer(path: str, vocab: int = VOCAB_SIZE) -> None:
    """The kit's WordLevel tokenizer (``vocab`` ids: pad, eos, unk, then ``t3`` ...) saved under ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    os.makedirs(path, exist_ok=True)
    words = {"<pad>": PAD_TOKEN_ID, "<eos>": EOS_TOKEN_ID, "<unk>": 2}
    words.update({f"t{i}": i for i in range(3, vocab)})
    core = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(path)


@contextlib.contextmanager
def _cpu_model_building(value_head: bool) -> Iterator[None]:
    """Two things verl hard-codes for accelerators, replaced while an engine is built on CPU.

    * A forward-only (ref) engine gets ``CPUOffloadPolicy(pin_memory=True)``; pinning needs an
      accelerator, so the policy is made with pinning off.
    * The value-head loader asks for ``flash_attention_2``; it is loaded with eager attention.
    """
    from verl.workers.engine.fsdp import transformer_impl

    original_policy = transformer_impl.CPUOffloadPolicy
    transformer_impl.CPUOffloadPolicy = lambda *a, **k: original_policy(pin_memory=False)
    patched_loader = None
    if value_head:
        from transformers import AutoModelForTokenClassification

        patched_loader = AutoModelForTokenClassification.from_pretrained.__func__

        def eager(cls, *args, **kwargs):
            kwargs["attn_implementation"] = "eager"
            if "config" in kwargs:
                kwargs["config"]._attn_implementation = "eager"
            return patched_loader(cls, *args, **kwargs)

        AutoModelForTokenClassification.from_pretrained = classmethod(eager)
    try:
        yield
    finally:
        transformer_impl.CPUOffloadPolicy = original_policy
        if patched_loader is not None:
            AutoModelForTokenClassification.from_pretrained = classmethod(patched_loader)


def make_engine(
    model_dir: str,
    *,
    forward_only: bool = False,
    value_head: bool = False,
    micro_batch_size: int = 2,
    lr: float = 1e-3,
) -> Any:
    """An initialised ``FSDPEngineWithLMHead`` (actor or ref) or ``FSDPEngineWithValueHead`` (critic)."""
    register_cpu_platform()
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    model_config = HFModelConfig(
        path=model_dir,
        override_config={"attn_implementation": "eager"},
        enable_gradient_checkpointing=False,
        use_remove_padding=True,
        model_type="value_model" if value_head else "language_model",
    )
    engine_config = FSDPEngineConfig(
        strategy="fsdp2",
        forward_only=forward_only,
        use_torch_compile=False,
        model_dtype="fp32",
        mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
        micro_batch_size_per_gpu=micro_batch_size,
        use_dynamic_bsz=False,
    )
    optimizer_config = FSDPOptimizerConfig(lr=lr, total_training_steps=10)
    cls = FSDPEngineWithValueHead if value_head else FSDPEngineWithLMHead
    engine = cls(
        model_config=model_config,
        engine_config=engine_config,
        optimizer_config=optimizer_config,
        checkpoint_config=CheckpointConfig(),
    )
    torch.manual_seed(0)  # a critic's value head is initialised at random: the same one in every run
    with _cpu_model_building(value_head):
        engine.initialize()
    return engine


@dataclass(frozen=True)
class Sample:
    """One rollout sample as the v1 trainer hands it to the engine.

    ``rollout_log_probs``: the rollout engine's log-prob of each response token, when it returned
    them (verl's ``rollout.calculate_log_probs``). ``old_log_probs``: the log-prob pass's values
    over the response, for an update (a constant -1 otherwise).
    """

    prompt: tuple[int, ...]
    response: tuple[int, ...]
    uid: str
    session_id: int = 0
    request_id: str | None = None
    rollout_log_probs: tuple[float, ...] | None = None  # the rollout engine's, one per response token
    old_log_probs: tuple[float, ...] | None = None


def random_samples(
    count: int,
    seed: int,
    prompt_lens: Sequence[int] = (5, 7, 4, 6),
    response_lens: Sequence[int] = (3, 4),
    prefix: str = "uid",
) -> list[Sample]:
    """``count`` samples with the given prompt and response lengths (cycled) and random token ids.

    Keep the lengths unequal: verl's ``list_of_dict_to_tensordict`` stacks equal-length fields
    into dense tensors, which its loss does not accept for responses.
    """
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(count):
        p = prompt_lens[i % len(prompt_lens)]
        r = response_lens[i % len(response_lens)]
        ids = torch.randint(3, VOCAB_SIZE, (p + r,), generator=gen).tolist()
        samples.append(
            Sample(
                prompt=tuple(ids[:p]),
                response=tuple(ids[p:]),
                uid=f"{prefix}{i // 2}",
                session_id=i % 2,
                request_id=f"req-{prefix}-{i}",
            )
        )
    return samples


def make_batch(samples: Sequence[Sample], micro_batch_size: int = 2, global_step: int = 1, **flags: Any) -> Any:
    """A v1-trainer-shaped TensorDict (jagged tensors, per-sample uid/session_id/request_id).

    With ``rollout_log_probs`` on the samples, every row carries them as verl 0.9.1's agent loop
    stores them (``AgentLoopOutput.as_dict``): one float32 tensor per sample, as long as its
    response, a field the v1 trainer's log-prob pass hands to the engine with the others.
    """
    from verl.utils import tensordict_utils as tu

    with_request_ids = any(s.request_id is not None for s in samples)
    with_rollout_log_probs = any(s.rollout_log_probs is not None for s in samples)
    rows = []
    for s in samples:
        ids = torch.tensor(s.prompt + s.response)
        response = torch.tensor(s.response)
        old = torch.tensor(s.old_log_probs) if s.old_log_probs is not None else torch.zeros(len(s.response)) - 1.0
        row = {
            "prompts": torch.tensor(s.prompt),
            "responses": response,
            "input_ids": ids,
            "position_ids": torch.arange(len(ids)),
            "response_mask": torch.ones_like(response),
            "loss_mask": torch.ones_like(response),  # verl: loss_mask is the response mask
            "old_log_probs": old,
            "advantages": torch.linspace(-1.0, 1.0, len(s.response)),
            "uid": s.uid,
            "session_id": s.session_id,
            "global_steps": global_step,
        }
        if with_request_ids:  # every row has the key, as in verl; a padding sample's is None
            row["request_id"] = s.request_id
        if with_rollout_log_probs:  # float32, one per response token (AgentLoopOutput.as_dict); a filler's are 0
            values = s.rollout_log_probs if s.rollout_log_probs is not None else (0.0,) * len(s.response)
            row["rollout_log_probs"] = torch.tensor(values, dtype=torch.float32)
        rows.append(row)
    data = tu.list_of_dict_to_tensordict(rows)
    tu.assign_non_tensor(data, **engine_settings(micro_batch_size, **flags))
    return data


def engine_settings(micro_batch_size: int, **flags: Any) -> dict[str, Any]:
    """The non-tensor fields verl's trainer sets on an engine batch (``flags`` override them)."""
    return {
        "use_remove_padding": True,
        "use_dynamic_bsz": False,
        "micro_batch_size_per_gpu": micro_batch_size,
        "use_fused_kernels": False,
        "temperature": 1.0,
        "calculate_entropy": True,
        "compute_loss": False,
        "pad_token_id": PAD_TOKEN_ID,
        **flags,
    }


def log_probs(engine: Any, data: Any) -> list[torch.Tensor]:
    """The actor's log-prob pass (``infer_batch`` under ``eval_mode``), one tensor per sample.

    ``[]`` on a Megatron pipeline stage other than the last: its engine returns no output there.
    """
    with engine.eval_mode():
        output = engine.infer_batch(data)
    if not output:
        return []
    return [t.clone() for t in output["model_output"]["log_probs"].unbind()]


def response_log_probs(full: Sequence[torch.Tensor], samples: Sequence[Sample]) -> list[torch.Tensor]:
    """Each sample's response part of :func:`log_probs`, cut as verl's ``response_from_nested`` does.

    The engine's log-prob at position t is that of token t + 1, so a prompt of P tokens and a
    response of R tokens give the response's log-probs at positions ``[P - 1, P - 1 + R)``.
    """
    return [lp[len(s.prompt) - 1 : len(s.prompt) - 1 + len(s.response)] for lp, s in zip(full, samples, strict=True)]


def update(engine: Any, data: Any, mini_batch_size: int | None = None) -> dict[str, Any]:
    """One PPO update on ``data`` (``train_batch`` under ``train_mode``); returns verl's metrics.

    For either engine (FSDP here, Megatron in :mod:`cpu_kit.megatron_cpu`): the loss is configured
    for the engine's strategy and data-parallel size.
    """
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import ActorConfig
    from verl.workers.utils.losses import ppo_loss

    size = len(data) if mini_batch_size is None else mini_batch_size
    micro = tu.get_non_tensor_data(data, "micro_batch_size_per_gpu", 1)
    actor_config = ActorConfig(
        strategy=engine.engine_config.strategy,
        ppo_mini_batch_size=size,
        ppo_micro_batch_size_per_gpu=micro,
        rollout_n=1,
    )
    tu.assign_non_tensor(
        data,
        calculate_entropy=False,
        compute_loss=True,
        global_batch_size=size * engine.get_data_parallel_size(),
        mini_batch_size=size,
    )
    with engine.train_mode():
        output = engine.train_batch(data, partial(ppo_loss, config=actor_config))
    return output


def shard(samples: Sequence[Sample], rank: int, world_size: int) -> list[Sample]:
    """This rank's contiguous share of ``samples`` (what verl's DP dispatch does)."""
    per_rank = len(samples) // world_size
    return list(samples[rank * per_rank : (rank + 1) * per_rank])
