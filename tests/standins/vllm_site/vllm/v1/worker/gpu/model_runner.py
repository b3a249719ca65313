"""Stand-in for Model Runner V2 (vllm/v1/worker/gpu/model_runner.py, vLLM 0.12+).

A different class from the V1 runner, not a subclass: its own request states, and it packs
requests decode first, then prefill (``prepare_inputs`` sorts by scheduled tokens).
"""

import torch

from vllm._release import HAS_SAMPLE_TOKENS
from vllm.model_executor.toy import ToyForCausalLM
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput


class GPUModelRunner:
    def __init__(self, vllm_config, device: torch.device) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.device = device
        self.req_states: dict[str, list[int]] = {}  # req_id -> all token ids
        self.computed: dict[str, int] = {}
        self.execute_model_state = None

    def load_model(self) -> None:
        torch.manual_seed(self.model_config.seed)
        self.model = ToyForCausalLM(self.model_config.vocab_size, self.model_config.hidden_size).eval()

    def get_model(self) -> torch.nn.Module:
        return self.model

    def prepare_inputs(self, scheduler_output):
        for req_id in scheduler_output.finished_req_ids:
            self.req_states.pop(req_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            self.req_states[new.req_id] = list(new.prompt_token_ids)
            self.computed[new.req_id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            self.computed[req_id] = computed
        tokens = scheduler_output.num_scheduled_tokens
        req_ids = sorted(tokens, key=tokens.get)  # decode first, then prefill
        ids, positions, sample_rows = [], [], []
        for req_id in req_ids:
            start, n = self.computed[req_id], tokens[req_id]
            ids.extend(self.req_states[req_id][start : start + n])
            positions.extend(range(start, start + n))
            if start + n == len(self.req_states[req_id]):
                sample_rows.append((req_id, len(ids) - 1))
        return torch.tensor(ids), torch.tensor(positions), sample_rows

    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False):
        if not scheduler_output.total_num_scheduled_tokens:
            return EMPTY_MODEL_RUNNER_OUTPUT
        input_ids, positions, sample_rows = self.prepare_inputs(scheduler_output)
        with torch.inference_mode():
            hidden = self.model(input_ids, positions)
            logits = self.model.compute_logits(hidden[[flat for _, flat in sample_rows]])
        self.execute_model_state = (logits, sample_rows)
        return None if HAS_SAMPLE_TOKENS else self.sample_tokens(None)

    def sample_tokens(self, grammar_output) -> ModelRunnerOutput:
        logits, sample_rows = self.execute_model_state
        self.execute_model_state = None
        output = ModelRunnerOutput()
        for (req_id, _), token in zip(sample_rows, logits.argmax(dim=-1).tolist(), strict=True):
            self.req_states[req_id].append(token)
            output.req_ids.append(req_id)
            output.sampled_token_ids.append([token])
        return output
