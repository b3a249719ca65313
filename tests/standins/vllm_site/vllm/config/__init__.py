from vllm.config.compilation import CompilationConfig, CompilationMode, CUDAGraphMode
from vllm.config.vllm import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig

__all__ = [
    "CacheConfig",
    "CompilationConfig",
    "CompilationMode",
    "CUDAGraphMode",
    "ModelConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "VllmConfig",
]
