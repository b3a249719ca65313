"""Drive the real vLLM engine (``.venv-vllm``) through one scenario; run by ``tests/support/real_vllm.py``.

Plain vLLM user code, no msprobe-hooks in it: the hooks come from the shim, switched on (or not)
by the environment, exactly as under ``msprobe-hooks run``. Usage::

    python real_vllm_child.py SCENARIO.json REPORT.json

The scenario (JSON): ``model`` (a model folder), ``engine`` (keyword arguments of ``vllm.LLM``
over the test defaults below), ``waves`` (lists of requests ``{"id", "prompt", "max_tokens"}``:
the requests of a wave are added together and run until all are finished, then the next wave
starts) and ``rounds`` (generations of all the waves, 1 by default). With ``serve: true`` the child
instead prints ``SERVE ready`` once the engine is up, then runs one generation per ``go`` line read
from stdin and prints ``SERVE <wall seconds>`` (the benchmark's interleaving; vLLM logs to stdout
too, hence the prefix).

The report (JSON): ``outputs`` (client id -> generated token ids, of the last round), ``steps`` (the
number of ``LLMEngine.step()`` calls that returned, one per engine-core step) and ``pid``.
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


def generate(engine, waves: list[list[dict]]) -> tuple[dict[str, list[int]], int]:
    """Every wave's requests, greedy; the generated ids per client id and the engine steps taken."""
    from vllm import SamplingParams

    outputs: dict[str, list[int]] = {}
    steps = 0
    for wave in waves:
        for request in wave:
            params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"], ignore_eos=True)
            engine.add_request(request["id"], {"prompt_token_ids": request["prompt"]}, params)
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    outputs[output.request_id] = list(output.outputs[0].token_ids)
            steps += 1
    return outputs, steps


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
        outputs, steps = generate(engine, scenario["waves"])
    with open(report_path, "w", encoding="utf-8") as handle:
        json.dump({"outputs": outputs, "steps": steps, "pid": os.getpid()}, handle)


if __name__ == "__main__":
    main(*sys.argv[1:3])
