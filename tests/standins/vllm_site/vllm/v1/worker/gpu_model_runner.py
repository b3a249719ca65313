"""Stand-in for vllm/v1/worker/gpu_model_runner.py: the V1 model runner on CPU.

Per step: ``execute_model`` calls ``_update_states`` (persistent batch: remove finished and
unscheduled rows, add new ones into free rows, condense, maybe reorder), packs the scheduled
tokens in row order, runs the model; ``sample_tokens`` (0.11.1+) then samples, or
``execute_model`` samples itself (0.11.0). A request samples only when its scheduled tokens
reach its last known token, so a partial prefill chunk samples nothing.
"""

import numpy as np
import torch

from vllm._release import HAS_SAMPLE_TOKENS
from vllm.model_executor.toy import ToyForCausalLM
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch


class StandInFailure(RuntimeError):
    """Raised by the stand-in's forward on request (ModelConfig.fail_on_forward)."""


def update_states(runner: "GPUModelRunner", scheduler_output: SchedulerOutput) -> None:
    """The body of ``_update_states`` (vLLM-Ascend 0.13 replaces that method with its own copy)."""
    batch = runner.input_batch
    for req_id in scheduler_output.finished_req_ids:
        runner.requests.pop(req_id, None)
        batch.remove_request(req_id)
    scheduled = scheduler_output.num_scheduled_tokens.keys()
    for req_id in [r for r in batch.req_id_to_index if r not in scheduled]:
        batch.remove_request(req_id)
    to_add = []
    for new in scheduler_output.scheduled_new_reqs:
        state = CachedRequestState(
            req_id=new.req_id,
            prompt_token_ids=new.prompt_token_ids,
            sampling_params=new.sampling_params,
            block_ids=new.block_ids,
            num_computed_tokens=new.num_computed_tokens,
        )
        runner.requests[new.req_id] = state
        to_add.append(state)
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
        state = runner.requests[req_id]
        state.num_computed_tokens = computed
        index = batch.req_id_to_index.get(req_id)
        if index is None:
            to_add.append(state)
        else:
            batch.num_computed_tokens_cpu[index] = computed
    for state in to_add:
        batch.add_request(state)
    batch.condense()
    runner._may_reorder_batch(scheduler_output)


class GPUModelRunner:
    def __init__(self, vllm_config, device: torch.device) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.scheduler_config = vllm_config.scheduler_config
        self.parallel_config = vllm_config.parallel_config
        self.compilation_config = vllm_config.compilation_config
        self.device = device
        self.requests: dict[str, CachedRequestState] = {}
        self.input_batch = InputBatch(self.scheduler_config.max_num_seqs, self.model_config.max_model_len)
        self.execute_model_state = None
        self.num_forwards = 0

    def load_model(self) -> None:
        torch.manual_seed(self.model_config.seed)
        # rope from rope_parameters, as vLLM 0.32's models under transformers 5: a top-level rope_theta is not read
        rope_theta = self.model_config.hf_config.rope_parameters["rope_theta"]
        self.model = ToyForCausalLM(self.model_config.vocab_size, self.model_config.hidden_size, rope_theta=rope_theta)
        self.model.eval()

    def get_model(self) -> torch.nn.Module:
        return self.model

    def _may_reorder_batch(self, scheduler_output: SchedulerOutput) -> None:
        if not self.vllm_config.reorder_decodes_first:
            return
        batch = self.input_batch
        decode = [
            scheduler_output.num_scheduled_tokens[r] == 1
            and batch.num_computed_tokens_cpu[i] >= batch.num_prompt_tokens[i]
            for i, r in enumerate(batch.req_ids)
        ]
        first_prefill = 0
        for i, is_decode in enumerate(decode):
            if is_decode:
                if i != first_prefill:
                    batch.swap_states(i, first_prefill)
                    decode[i], decode[first_prefill] = decode[first_prefill], decode[i]
                first_prefill += 1

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        update_states(self, scheduler_output)

    def _prepare_inputs(self, scheduler_output: SchedulerOutput):
        batch = self.input_batch
        ids, positions, sample_rows = [], [], []
        for i, req_id in enumerate(batch.req_ids):
            n = scheduler_output.num_scheduled_tokens[req_id]
            start = int(batch.num_computed_tokens_cpu[i])
            ids.append(batch.token_ids_cpu[i, start : start + n])
            positions.append(np.arange(start, start + n))
            if start + n == batch.num_tokens[i]:
                sample_rows.append((i, req_id, sum(len(x) for x in ids) - 1))
        input_ids = torch.from_numpy(np.concatenate(ids).astype(np.int64))
        return input_ids, torch.from_numpy(np.concatenate(positions)), sample_rows

    def _forward(self, input_ids, positions, sample_rows):
        self.num_forwards += 1
        if self.model_config.fail_on_forward == self.num_forwards:
            raise StandInFailure(f"forward {self.num_forwards} failed on purpose")
        with torch.inference_mode():
            hidden = self.model(input_ids, positions)
            return self.model.compute_logits(hidden[[flat for _, _, flat in sample_rows]])

    def _sample(self, logits, sample_rows) -> ModelRunnerOutput:
        output = ModelRunnerOutput()
        sampled = dict(zip([r for _, r, _ in sample_rows], logits.argmax(dim=-1).tolist(), strict=True))
        for i, req_id in enumerate(self.input_batch.req_ids):
            token = sampled.get(req_id)
            output.req_ids.append(req_id)
            output.sampled_token_ids.append([] if token is None else [token])
            if token is not None:
                self.requests[req_id].output_token_ids.append(token)
                self.input_batch.append_token(i, token)
        return output

    def execute_model(self, scheduler_output: SchedulerOutput, intermediate_tensors=None):
        if self.execute_model_state is not None:
            raise RuntimeError("State error: sample_tokens() must be called after execute_model() returns None.")
        self._update_states(scheduler_output)
        if not scheduler_output.total_num_scheduled_tokens:
            return EMPTY_MODEL_RUNNER_OUTPUT
        input_ids, positions, sample_rows = self._prepare_inputs(scheduler_output)
        logits = self._forward(input_ids, positions, sample_rows)
        if not HAS_SAMPLE_TOKENS:
            return self._sample(logits, sample_rows)
        self.execute_model_state = (logits, sample_rows)
        return None

    if HAS_SAMPLE_TOKENS:

        def sample_tokens(self, grammar_output) -> ModelRunnerOutput:
            if self.execute_model_state is None:
                return EMPTY_MODEL_RUNNER_OUTPUT
            logits, sample_rows = self.execute_model_state
            self.execute_model_state = None
            return self._sample(logits, sample_rows)
