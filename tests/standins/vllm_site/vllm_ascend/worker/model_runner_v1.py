"""Stand-in for vllm_ascend/worker/model_runner_v1.py: NPUModelRunner(GPUModelRunner).

It overrides execute_model and sample_tokens without calling the base ones, and drives its own
msprobe PrecisionDebugger from ``additional_config.dump_config_path`` (``dump_config`` in 0.12),
placing start/stop/step where each release does.
"""

from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_ascend._release import (
    CONFIG_KEY,
    INLINE_DUMP_CALLS,
    PASSES_SCHEDULED_TOKENS,
    START_BEFORE_UPDATE_STATES,
)


class NPUModelRunner(GPUModelRunner):
    def __init__(self, vllm_config, device) -> None:
        super().__init__(vllm_config, device)
        dump_cfg = vllm_config.additional_config.get(CONFIG_KEY)
        self.debugger = None
        if dump_cfg is not None:
            self._debugger_started = False
            if self.model_config.enforce_eager:
                from msprobe.pytorch import PrecisionDebugger

                self.debugger = PrecisionDebugger(dump_cfg)
            else:
                raise RuntimeError("Dumping/debugging only works in eager mode.")

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        if START_BEFORE_UPDATE_STATES:
            self._start_dump_data()
        self._update_states(scheduler_output)
        if not scheduler_output.total_num_scheduled_tokens:
            return EMPTY_MODEL_RUNNER_OUTPUT
        if not INLINE_DUMP_CALLS and not START_BEFORE_UPDATE_STATES:
            if PASSES_SCHEDULED_TOKENS:
                self._start_dump_data(scheduled_tokens=scheduler_output.num_scheduled_tokens)
            else:
                self._start_dump_data()
        input_ids, positions, sample_rows = self._prepare_inputs(scheduler_output)
        if INLINE_DUMP_CALLS and self.debugger is not None:
            self.debugger.start(model=self.model)
        logits = self._forward(input_ids, positions, sample_rows)
        self.execute_model_state = (logits, sample_rows)
        return None

    def sample_tokens(self, grammar_output):
        if self.execute_model_state is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        logits, sample_rows = self.execute_model_state
        self.execute_model_state = None
        output = self._sample(logits, sample_rows)
        if INLINE_DUMP_CALLS:
            if self.debugger is not None:
                self.debugger.stop()
                self.debugger.step()
        else:
            self._finalize_dump_data()
        return output

    def _start_dump_data(self, **kwargs) -> None:
        if self.debugger is None or self._debugger_started:
            return
        self.debugger.start(self.model, **kwargs)
        self._debugger_started = True

    def _finalize_dump_data(self, **kwargs) -> None:
        if self.debugger is None or not self._debugger_started:
            return
        if hasattr(self.debugger, "stop"):
            self.debugger.stop()
            self._debugger_started = False
        self.debugger.step(**kwargs)
