from dataclasses import dataclass, field
from typing import Any

from vllm.config.compilation import CompilationConfig


@dataclass
class ModelConfig:
    vocab_size: int = 64
    hidden_size: int = 32
    max_model_len: int = 256
    enforce_eager: bool = True
    seed: int = 0
    fail_on_forward: int | None = None  # stand-in knob: the n-th forward (1-based) raises


@dataclass
class CacheConfig:
    block_size: int = 4
    enable_prefix_caching: bool = False


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 8


@dataclass
class ParallelConfig:
    world_size: int = 1
    distributed_executor_backend: str = "uni"  # or "mp": one spawned/forked process per rank
    worker_cls: str = "vllm.v1.worker.gpu_worker.Worker"


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
