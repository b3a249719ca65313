"""Stand-in: the ServerArgs fields the stand-in and msprobe-hooks read (names and defaults of 0.5.10)."""

import dataclasses


@dataclasses.dataclass
class ServerArgs:
    model_path: str = "tiny"
    device: str = "cpu"
    tp_size: int = 1
    dp_size: int = 1
    enable_dp_attention: bool = False
    disable_cuda_graph: bool = False
    disable_piecewise_cuda_graph: bool = False
    disable_overlap_schedule: bool = False
    disable_radix_cache: bool = False
    enable_mixed_chunk: bool = False
