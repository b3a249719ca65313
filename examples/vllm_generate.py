"""The inference side of the demo: vLLM's real engine generates for a prompts file, one request at a time.

    python examples/vllm_generate.py MODEL_DIR PROMPTS_FILE [--max-tokens N] [--dtype float32]
                                     [--tensor-parallel-size K] [--max-model-len N]

``PROMPTS_FILE`` holds one JSON object a line, ``{"request_id": "...", "prompt_token_ids": [...]}``
(the same file ``examples/cpu_demo.py --prompts`` reads, so both sides see the same prompts under
the same request ids). Requests are added and finished one at a time, so every prefill step holds
exactly one prompt. Eager mode, no prefix caching: what a precision comparison needs. Nothing
here mentions any dump tool: dumps, if any, come from the environment.

``--tensor-parallel-size K`` runs K workers (vLLM's ``mp`` executor, gloo); on CPU each needs its cores
named, e.g. ``VLLM_CPU_OMP_THREADS_BIND="0|1"`` for K=2 (vLLM refuses to start without it on one NUMA node).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root: cpu_kit

from cpu_kit.demo_inputs import read_prompts  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a Hugging Face model folder")
    parser.add_argument("prompts", help="JSON lines of request_id and prompt_token_ids")
    parser.add_argument("--max-tokens", type=int, default=2, help="tokens to generate per prompt (default 2)")
    parser.add_argument("--dtype", default="float32", help="the engine's dtype (default float32)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM's tensor parallel size (default 1)")
    parser.add_argument("--max-model-len", type=int, default=256, help="the engine's context length (default 256)")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    llm = LLM(
        model=args.model,
        enforce_eager=True,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        tensor_parallel_size=args.tensor_parallel_size,
        enable_prefix_caching=False,
        seed=0,
    )
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    for prompt in read_prompts(args.prompts):
        engine.add_request(prompt["request_id"], {"prompt_token_ids": prompt["prompt_token_ids"]}, params)
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    print(json.dumps({"request_id": prompt["request_id"], "tokens": output.outputs[0].token_ids}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
