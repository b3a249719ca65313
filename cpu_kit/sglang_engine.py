"""A long-lived real SGLang engine (sglang 0.5.21 on CPU, ``.venv-sglang``) driven over JSON lines, and its client.

    .venv-sglang/bin/python cpu_kit/sglang_engine.py MODEL_DIR [--dtype float32] [--engine-kwargs JSON]

starts ``sglang.Engine`` once (CPU, no CUDA graph, the radix cache off, a capped KV cache, seed 0, token ids in
and out: no tokenizer; ``--engine-kwargs``, SGLang's own engine arguments over those, as verl's
``engine_kwargs.sglang`` gives them, e.g. ``{"msprobe_dump_config": PATH}``, SGLang's own dump switch) and answers
:mod:`cpu_kit.engine_server`'s protocol with the commands of :mod:`cpu_kit.vllm_engine`:

* ``generate``: the same requests and answer; a wave (one request, or all with ``packed``) is one
  ``Engine.generate`` call with ``return_logprob``. The log-probs are what SGLang returns for the sampled tokens:
  its default, of the logits divided by the request's temperature, or of the raw logits under
  ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` (read by SGLang's sampler from the environment);
* ``update_weights``: ``Engine.update_weights_from_disk`` on DIR (SGLang's own in-place reload); the radix cache
  is off, so nothing computed with the old weights is reused.

SGLang's CPU engine needs ``SGLANG_USE_CPU_ENGINE=1`` and, on a CPU without AMX, the ``sgl_kernel`` stub the
tests and docs/inference-sglang.md name: the client adds both to the environment it is given. Nothing here
mentions any dump tool: dumps come from the environment and the engine arguments given.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file in the SGLang venv: cpu_kit is imported from the repository root
    sys.path.insert(0, str(REPO))

from cpu_kit import engine_server  # noqa: E402

# docs/inference-sglang.md: the sgl_kernel names SGLang imports on a CPU without AMX, none of them called.
KERNEL_STUB = REPO / "tests" / "standins" / "sgl_kernel_stub"
# What SGLang needs on a CPU box: no CUDA graph, a capped KV cache (else ~16 GB reserved).
ENGINE_DEFAULTS = {
    "device": "cpu",
    "disable_cuda_graph": True,
    "max_total_tokens": 4096,
    "disable_radix_cache": True,
    "skip_tokenizer_init": True,
    "random_seed": 0,
    "log_level": "warning",
}


class _Server:
    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def generate(self, requests: Sequence[Mapping[str, Any]], packed: bool = False) -> dict[str, Any]:
        waves = [list(requests)] if packed else [[request] for request in requests]
        outputs = []
        for wave in waves:
            answers = self.engine.generate(
                input_ids=[list(request["prompt_token_ids"]) for request in wave],
                rid=[request["id"] for request in wave],
                sampling_params=[
                    {
                        "temperature": request.get("temperature", 0.0),
                        "top_p": request.get("top_p", 1.0),
                        "sampling_seed": request.get("seed"),
                        "max_new_tokens": request["max_tokens"],
                        "ignore_eos": True,
                    }
                    for request in wave
                ],
                return_logprob=True,
            )
            for request, answer in zip(wave, answers, strict=True):
                # (log-prob, token id, text) per generated token; no text without a tokenizer
                logprobs = [entry[0] for entry in answer["meta_info"]["output_token_logprobs"]]
                outputs.append({"id": request["id"], "token_ids": list(answer["output_ids"]), "logprobs": logprobs})
        return {"outputs": outputs}

    def update_weights(self, path: str) -> dict[str, Any]:
        done, message = self.engine.update_weights_from_disk(os.path.abspath(path))[:2]
        if not done:
            raise RuntimeError(f"SGLang's update_weights_from_disk({path}) failed: {message}")
        return {}


def serve(model: str, dtype: str, engine_kwargs: Mapping[str, Any]) -> int:
    """Start the engine on ``model`` and answer commands from stdin until ``shutdown`` or EOF."""
    replies = engine_server.claim_stdout()

    import sglang

    engine = sglang.Engine(model_path=model, dtype=dtype, **{**ENGINE_DEFAULTS, **engine_kwargs})
    try:
        server = _Server(engine)
        hello = {"pid": os.getpid(), "engine": "sglang", "version": sglang.__version__}
        return engine_server.answer_commands(
            replies, hello, {"generate": server.generate, "update_weights": server.update_weights}
        )
    finally:
        engine.shutdown()


class SglangEngine(engine_server.EngineClient):
    """This module run as a server in ``python`` (a ``.venv-sglang`` interpreter), stderr to ``log_path``; ``env`` is
    its environment, to which the CPU engine's switch and the kernel stub are added."""

    def __init__(
        self,
        python: str | os.PathLike,
        model: str | os.PathLike,
        *,
        env: Mapping[str, str],
        log_path: str | os.PathLike,
        dtype: str = "float32",
        engine_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        command = engine_server.server_command(python, __file__, model, dtype)
        command += ["--engine-kwargs", json.dumps(dict(engine_kwargs or {}))]
        path = os.pathsep.join(p for p in (env.get("PYTHONPATH"), os.fspath(KERNEL_STUB)) if p)
        cpu = {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": path}  # else the scheduler imports vLLM's custom ops
        super().__init__(command, env={**env, **cpu}, log_path=log_path, name="the SGLang engine")


def main(argv: Sequence[str] | None = None) -> int:
    parser = engine_server.server_arguments(__doc__.splitlines()[0])
    parser.add_argument(
        "--engine-kwargs",
        type=json.loads,
        default={},
        help='sglang.Engine\'s own arguments as a JSON object, e.g. \'{"msprobe_dump_config": "/cfg.json"}\'',
    )
    args = parser.parse_args(argv)
    return serve(args.model, args.dtype, args.engine_kwargs)


if __name__ == "__main__":
    sys.exit(main())
