from dataclasses import dataclass, field
from typing import Any

import torch

from vllm.config.compilation import CompilationConfig


class HFConfig:
    """The effective HF config (``model_config.hf_config``): the checkpoint's fields with ``hf_overrides`` set on top
    (as transformers 5 configs, rope in ``rope_parameters``)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class ModelConfig:
    vocab_size: int = 64
    hidden_size: int = 32
    max_model_len: int = 256
    enforce_eager: bool = True
    seed: int = 0
    fail_on_forward: int | None = None  # stand-in knob: the n-th forward (1-based) raises
    dtype: torch.dtype = torch.float32
    quantization: str | None = None
    logprobs_mode: str = "raw_logprobs"
    hf_overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        checkpoint = {
            "_name_or_path": "/models/toy",
            "model_type": "toy",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": 2,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        }
        self.hf_config = HFConfig({**checkpoint, **self.hf_overrides})

    @property
    def hf_text_config(self) -> HFConfig:
        return self.hf_config

    @property
    def head_dtype(self) -> torch.dtype:
        """vLLM 0.32's: ``hf_overrides={"head_dtype": ...}``, else the model dtype; an unknown name raises."""
        name = getattr(self.hf_config, "head_dtype", None)
        if name is None:
            return self.dtype
        if not hasattr(torch, name):
            raise ValueError(f"Unknown dtype: {name!r}")
        return getattr(torch, name)


@dataclass
class CacheConfig:
    block_size: int = 4
    enable_prefix_caching: bool = False
    cache_dtype: str = "auto"


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 8
    enable_chunked_prefill: bool = True


@dataclass
class ParallelConfig:
    world_size: int = 1
    distributed_executor_backend: str = "uni"  # or "mp": one spawned/forked process per rank
    worker_cls: str = "vllm.v1.worker.gpu_worker.Worker"
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False

    @property
    def tensor_parallel_size(self) -> int:
        return self.world_size // self.pipeline_parallel_size


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)
    additional_config: dict[str, Any] = field(default_factory=dict)
    # Stand-in knob: attention backends that want decodes first (MLA, FlashInfer) reorder the batch.
    reorder_decodes_first: bool = False

    def __post_init__(self) -> None:
        self.compilation_config.finalize(self.model_config.enforce_eager)
