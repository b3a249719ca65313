"""Stand-in: the ServerArgs fields the stand-in and msprobe-hooks read (names and defaults of 0.5.11)."""

import dataclasses

from sglang_common import ServerArgsBase


@dataclasses.dataclass
class ServerArgs(ServerArgsBase):
    disable_cuda_graph: bool = False
    disable_piecewise_cuda_graph: bool = False
    skip_server_warmup: bool = False
    msprobe_dump_config: str | None = None

    def __post_init__(self):
        self._handle_other_validations()

    def _handle_other_validations(self):
        if self.msprobe_dump_config is not None:
            # As SGLang does: eager mode and no warmup, but the piecewise prefill graph stays as configured.
            self.disable_cuda_graph = True
            self.skip_server_warmup = True
