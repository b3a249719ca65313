"""Stand-in: the ServerArgs fields the stand-in reads (0.5.23 keeps them in arg groups; flat here)."""

import dataclasses

from sglang_common import ServerArgsBase


@dataclasses.dataclass
class ServerArgs(ServerArgsBase):
    skip_server_warmup: bool = False
    # 0.5.23: a msprobe config turns off the decode and prefill CUDA graph phases (serving_hook.py).
    msprobe_dump_config: str | None = None
