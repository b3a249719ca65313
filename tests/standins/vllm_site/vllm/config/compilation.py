import enum
from dataclasses import dataclass

from vllm._release import Version, release


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)


class CompilationMode(enum.IntEnum):
    NONE = 0
    STOCK_TORCH_COMPILE = 1
    DYNAMO_TRACE_ONCE = 2
    VLLM_COMPILE = 3


@dataclass
class CompilationConfig:
    # 0.11.0 has only `level` (0 = no compilation); later releases `mode` (CompilationMode).
    level: int | None = None
    mode: CompilationMode | None = None
    cudagraph_mode: CUDAGraphMode | None = None

    def finalize(self, enforce_eager: bool) -> None:
        """What VllmConfig.__post_init__ does: enforce_eager turns compilation and CUDA graphs off."""
        compiled = CompilationMode.NONE if enforce_eager else CompilationMode.VLLM_COMPILE
        if release < Version("0.11.1"):
            if self.level is None:
                self.level = int(compiled)
        elif self.mode is None:
            self.mode = compiled
        if self.cudagraph_mode is None:
            self.cudagraph_mode = CUDAGraphMode.NONE if enforce_eager else CUDAGraphMode.FULL_AND_PIECEWISE
        if enforce_eager:
            self.cudagraph_mode = CUDAGraphMode.NONE
