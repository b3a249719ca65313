"""Stand-in for sglang/srt/runtime_context.py: the process's parallel and observability settings."""

import dataclasses


@dataclasses.dataclass
class ParallelContext:
    tp_rank: int = 0
    tp_size: int = 1
    dp_size: int = 1


@dataclasses.dataclass
class ObservabilityContext:
    msprobe_dump_config: str | None = None


_parallel = ParallelContext()
_observability = ObservabilityContext()


def set_context(server_args, tp_rank: int) -> None:
    global _parallel, _observability
    dp_size = server_args.dp_size if server_args.enable_dp_attention else 1
    _parallel = ParallelContext(tp_rank=tp_rank, tp_size=server_args.tp_size, dp_size=dp_size)
    _observability = ObservabilityContext(msprobe_dump_config=server_args.msprobe_dump_config)


def get_parallel() -> ParallelContext:
    return _parallel


def get_observability() -> ObservabilityContext:
    return _observability
