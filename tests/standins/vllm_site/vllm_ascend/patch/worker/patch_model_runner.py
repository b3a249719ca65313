"""Like vllm_ascend/patch/worker/patch_model_runner.py in 0.13.0: replaces GPUModelRunner._update_states.

vLLM-Ascend applies this at plugin/worker start, after vLLM's modules were imported (and so after
msprobe-hooks wrapped them).
"""

from vllm.v1.worker import gpu_model_runner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

PATCHED_CALLS = []


def _update_states(self, scheduler_output) -> None:
    gpu_model_runner.update_states(self, scheduler_output)
    PATCHED_CALLS.append(scheduler_output.total_num_scheduled_tokens)


GPUModelRunner._update_states = _update_states
