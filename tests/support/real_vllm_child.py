"""Drive the real vLLM engine (``.venv-vllm``) through one scenario; run by ``tests/support/real_vllm.py``.

Plain vLLM user code, no msprobe-hooks in it: the hooks come from the shim, switched on (or not)
by the environment, exactly as under ``msprobe-hooks run``. Usage::

    python real_vllm_child.py SCENARIO.json REPORT.json

The scenario (JSON): ``model`` (a model folder), ``engine`` (keyword arguments of ``vllm.LLM`` over the test
defaults below), ``waves`` (lists of requests ``{"id", "prompt", "max_tokens"}``, with an optional
``sampling``, keyword arguments of ``SamplingParams`` over greedy decoding: the requests of a wave are added
together and run until all are finished, then the next wave starts), ``wave_steps`` (optional, one entry per
wave: run that many engine steps after adding the wave, then add the next one while its requests still run;
``null``: until all are finished, the default), ``logprobs`` (report the sampled tokens' log-probs too) and
``rounds`` (generations of all the waves, 1 by default). Which step packs what is fixed by the waves only with
vLLM's engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): in its own process it schedules as
requests arrive. With ``serve: true`` the child instead prints ``SERVE ready`` once the engine is up, then
runs one generation per ``go`` line read from stdin and prints ``SERVE <wall seconds>`` (the benchmark's
interleaving; vLLM logs to stdout too, hence the prefix).

The report (JSON): ``outputs`` (client id -> generated token ids, of the last round), ``logprobs``
(client id -> each generated token's log-prob, with ``logprobs``), ``steps`` (the number of
``LLMEngine.step()`` calls that returned, one per engine-core step) and ``pid``.
"""

from __future__ import annotations

import json
import os
import sys

from engine_serve import serve  # this folder is the script's (it runs as a file)

ENGINE_DEFAULTS = {
    "enforce_eager": True,
    "dtype": "float32",
    "enable_prefix_caching": False,
    "max_model_len": 256,
    "seed": 0,
}


def generate(
    engine, waves: list[list[dict]], wave_steps: list[int | None] | None = None, logprobs: bool = False
) -> tuple[dict[str, list[int]], dict[str, list[float]], int]:
    """Every wave's requests, greedy; the generated ids (and log-probs) per client id and the engine steps taken."""
    from vllm import SamplingParams

    outputs: dict[str, list[int]] = {}
    sampled: dict[str, list[float]] = {}
    steps = 0
    limits = wave_steps or [None] * len(waves)
    for index, (wave, limit) in enumerate(zip(waves, limits, strict=True)):
        for request in wave:
            greedy = {"temperature": 0.0, "logprobs": 0 if logprobs else None}
            params = SamplingParams(
                max_tokens=request["max_tokens"], ignore_eos=True, **{**greedy, **request.get("sampling", {})}
            )
            engine.add_request(request["id"], {"prompt_token_ids": request["prompt"]}, params)
        taken = 0
        last = index == len(waves) - 1
        while engine.has_unfinished_requests() and (limit is None or taken < limit or last):
            for output in engine.step():
                if output.finished:
                    completion = output.outputs[0]
                    outputs[output.request_id] = list(completion.token_ids)
                    if logprobs:  # one {token id: Logprob} per generated token, the sampled one's among them
                        pairs = zip(completion.token_ids, completion.logprobs, strict=True)
                        sampled[output.request_id] = [entry[token].logprob for token, entry in pairs]
            steps += 1
            taken += 1
    return outputs, sampled, steps


def main(scenario_path: str, report_path: str) -> None:
    from vllm import LLM

    with open(scenario_path, encoding="utf-8") as handle:
        scenario = json.load(handle)
    llm = LLM(model=scenario["model"], **{**ENGINE_DEFAULTS, **scenario.get("engine", {})})
    engine = llm.llm_engine
    if scenario.get("serve"):
        serve(lambda: generate(engine, scenario["waves"]))
        return
    for _ in range(scenario.get("rounds", 1)):
        outputs, logprobs, steps = generate(
            engine, scenario["waves"], scenario.get("wave_steps"), scenario.get("logprobs", False)
        )
    report = {"outputs": outputs, "steps": steps, "pid": os.getpid()}
    if scenario.get("logprobs"):
        report["logprobs"] = logprobs
    with open(report_path, "w", encoding="utf-8") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    main(*sys.argv[1:3])
