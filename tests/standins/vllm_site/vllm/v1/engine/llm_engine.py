"""Engine loop: schedule, execute_model, sample_tokens (0.11.1+), update the scheduler."""

import uuid

from vllm._release import randomizes_request_ids
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, SamplingParams


class LLMEngine:
    def __init__(self, vllm_config) -> None:
        if vllm_config.parallel_config.distributed_executor_backend == "mp":
            from vllm.v1.executor.multiproc_executor import MultiprocExecutor as executor_class
        else:
            from vllm.v1.executor.uniproc_executor import UniProcExecutor as executor_class
        self.scheduler = Scheduler(vllm_config)
        self.model_executor = executor_class(vllm_config)
        self.requests: dict[str, Request] = {}

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], max_tokens: int = 4, sampling: dict | None = None
    ) -> str:
        """Returns the engine's id: the client's id plus a random suffix from 0.14 on. (The stand-in samples greedily
        whatever ``sampling`` says; the parameters reach the runner as vLLM's do.)"""
        if randomizes_request_ids():
            request_id = f"{request_id}-{uuid.uuid4().hex[:8]}"
        params = SamplingParams(max_tokens, **(sampling or {}))
        request = self.requests[request_id] = Request(request_id, list(prompt_token_ids), params)
        self.scheduler.add_request(request)
        return request_id

    def step(self):
        scheduler_output = self.scheduler.schedule()
        output = self.model_executor.execute_model(scheduler_output)
        if output is None:
            output = self.model_executor.sample_tokens(None)
        self.scheduler.update_from_output(scheduler_output, output)
        return scheduler_output

    def run(self) -> list:
        """Step until every request finished and was freed; returns each step's scheduler output."""
        steps = []
        while self.scheduler.has_requests():
            steps.append(self.step())
        return steps

    def shutdown(self) -> None:
        self.model_executor.shutdown()
