import multiprocessing
import os


def get_mp_context():
    """Like vLLM: VLLM_WORKER_MULTIPROC_METHOD (fork by default; vLLM forces spawn inside a Ray actor)."""
    return multiprocessing.get_context(os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "fork"))
