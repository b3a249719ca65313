"""A small V1-style scheduler: token budget, running requests first, chunked prefill, prefix cache.

Like vLLM's, it sends each step's computed-before counts and advances them at schedule time, puts
running requests before new ones in ``num_scheduled_tokens``, gives a new request the longest
block-aligned cached prefix of an earlier prompt (never the whole prompt), and cuts a prefill that
does not fit the budget into chunks.
"""

from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request


class Scheduler:
    def __init__(self, vllm_config) -> None:
        self.budget = vllm_config.scheduler_config.max_num_batched_tokens
        self.max_num_seqs = vllm_config.scheduler_config.max_num_seqs
        self.block_size = vllm_config.cache_config.block_size
        self.prefix_caching = vllm_config.cache_config.enable_prefix_caching
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self.cached_blocks: set[tuple[int, ...]] = set()  # prompt prefixes, block-aligned

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_requests(self) -> bool:
        return bool(self.waiting or self.running or self.finished_req_ids)

    def _cached_prefix(self, prompt: list[int]) -> int:
        if not self.prefix_caching:
            return 0
        hit = 0
        for end in range(self.block_size, len(prompt), self.block_size):  # never the whole prompt
            if tuple(prompt[:end]) not in self.cached_blocks:
                break
            hit = end
        return hit

    def schedule(self) -> SchedulerOutput:
        budget = self.budget
        num_scheduled: dict[str, int] = {}
        cached = CachedRequestData.make_empty()
        new: list[NewRequestData] = []
        for req in self.running:
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if n <= 0:
                continue
            num_scheduled[req.request_id] = n
            budget -= n
            cached.req_ids.append(req.request_id)
            cached.new_token_ids.append([])
            cached.new_block_ids.append(None)
            cached.num_computed_tokens.append(req.num_computed_tokens)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting.pop(0)
            req.num_computed_tokens = self._cached_prefix(req.prompt_token_ids)
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            num_scheduled[req.request_id] = n
            budget -= n
            new.append(NewRequestData.from_request(req, ([],)))
            self.running.append(req)
        for req in self.running:  # vLLM advances computed tokens when it schedules
            req.num_computed_tokens += num_scheduled.get(req.request_id, 0)
        output = SchedulerOutput(
            scheduled_new_reqs=new,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            finished_req_ids=self.finished_req_ids,
        )
        self.finished_req_ids = set()
        return output

    def update_from_output(self, scheduler_output: SchedulerOutput, output: ModelRunnerOutput) -> None:
        for req_id, sampled in zip(output.req_ids, output.sampled_token_ids, strict=True):
            req = next(r for r in self.running if r.request_id == req_id)
            req.output_token_ids.extend(sampled)
        for req in self.running:
            if req.num_computed_tokens >= len(req.prompt_token_ids):
                prompt = req.prompt_token_ids
                for end in range(self.block_size, len(prompt) + 1, self.block_size):
                    self.cached_blocks.add(tuple(prompt[:end]))
        for req in [r for r in self.running if r.finished]:
            self.running.remove(req)
            self.finished_req_ids.add(req.request_id)
