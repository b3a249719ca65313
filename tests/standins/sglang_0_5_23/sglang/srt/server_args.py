"""Stand-in: the ServerArgs fields the stand-in reads (0.5.23 keeps them in arg groups; flat here)."""

import dataclasses


@dataclasses.dataclass
class ServerArgs:
    model_path: str = "tiny"
    device: str = "cpu"
    tp_size: int = 1
    dp_size: int = 1
    enable_dp_attention: bool = False
    disable_overlap_schedule: bool = False
    disable_radix_cache: bool = False
    enable_mixed_chunk: bool = False
    skip_server_warmup: bool = False
    # 0.5.23: a msprobe config turns off the decode and prefill CUDA graph phases (serving_hook.py).
    msprobe_dump_config: str | None = None
