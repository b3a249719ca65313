"""Stand-in: the ServerArgs fields the stand-in and msprobe-hooks read (names and defaults of 0.5.2)."""

import dataclasses

from sglang_common import ServerArgsBase


@dataclasses.dataclass
class ServerArgs(ServerArgsBase):
    disable_cuda_graph: bool = False
