"""Virtual pipeline parallelism, which the training dump cannot serve: why, said once.

The Megatron engine patch refuses it at the first dumped pass (:func:`refusal`); preflight's rule
``virtual-pipeline`` refuses the same configuration before Ray starts, for the same reason
(:data:`REASON`).
"""

from __future__ import annotations

# The Megatron config key (under ``actor_rollout_ref.actor.megatron``); null or 1 is off.
CONFIG_KEY = "virtual_pipeline_model_parallel_size"
REASON = "micro-batches interleave across chunks, so no dump can hold exactly one"
FIX = f"set {CONFIG_KEY} to null for the collection run"


def refusal(chunks: int) -> str:
    """The engine patch's refusal for a rank that holds ``chunks`` model chunks."""
    chunked = f"virtual pipeline parallelism ({chunks} model chunks per rank)"
    return f"DUMP_ON=1 with {chunked} is not supported: {REASON}; {FIX}"
