"""What the scheduler sends the workers each step (shape of vllm/v1/core/sched/output.py)."""

from dataclasses import dataclass, field


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int] | None
    sampling_params: object | None
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int  # > 0 on a prefix-cache hit

    @classmethod
    def from_request(cls, request, block_ids) -> "NewRequestData":
        return cls(
            req_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            sampling_params=request.sampling_params,
            block_ids=block_ids,
            num_computed_tokens=request.num_computed_tokens,
        )


@dataclass
class CachedRequestData:
    req_ids: list[str]
    resumed_req_ids: set[str]
    new_token_ids: list[list[int]]
    new_block_ids: list[tuple[list[int], ...] | None]
    num_computed_tokens: list[int]

    @classmethod
    def make_empty(cls) -> "CachedRequestData":
        return cls([], set(), [], [], [])


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    # req_id -> tokens scheduled this step, in scheduler order (running first, then new)
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    finished_req_ids: set[str] = field(default_factory=set)
