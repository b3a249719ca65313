"""Drive the real SGLang engine (``.venv-sglang``) through one scenario; run by ``tests/support/real_sglang.py``.

Plain SGLang user code, no msprobe-hooks in it: the hooks come from the shim, switched on (or not)
by the environment, exactly as under ``msprobe-hooks run``. Usage::

    python real_sglang_child.py SCENARIO.json REPORT.json

The scenario (JSON): ``model`` and ``tokenizer`` (folders), ``engine`` (keyword arguments of
``sglang.Engine`` over the CPU defaults below) and ``waves`` (lists of requests ``{"id", "prompt",
"max_new_tokens"}``: the requests of a wave go in one ``generate`` call, the next wave after it).
With ``serve: true`` the child instead prints ``SERVE ready`` once the engine is up, then runs all
the waves once per ``go`` line read from stdin and prints ``SERVE <wall seconds>`` (the
benchmark's interleaving; SGLang logs to stdout too, hence the prefix).

The report (JSON): ``outputs`` (request id -> generated token ids) and ``pid`` (this process; the
model runs in SGLang's scheduler process, a child of this one).
"""

from __future__ import annotations

import json
import os
import sys

from engine_serve import serve  # this folder is the script's (it runs as a file)

# What SGLang needs on a CPU box (docs/inference-sglang.md): no CUDA graph, a capped KV cache.
ENGINE_DEFAULTS = {
    "device": "cpu",
    "disable_cuda_graph": True,
    "max_total_tokens": 4096,
    "dtype": "float32",
    "random_seed": 0,
    "log_level": "warning",
}


def generate(engine, waves: list[list[dict]]) -> dict[str, list[int]]:
    """Every wave's requests, greedy; the generated ids per request id."""
    outputs: dict[str, list[int]] = {}
    for wave in waves:
        answers = engine.generate(
            input_ids=[request["prompt"] for request in wave],
            rid=[request["id"] for request in wave],
            sampling_params=[
                {"temperature": 0.0, "max_new_tokens": request["max_new_tokens"], "ignore_eos": True}
                for request in wave
            ],
        )
        for request, answer in zip(wave, answers, strict=True):
            outputs[request["id"]] = list(answer["output_ids"])
    return outputs


def main(scenario_path: str, report_path: str) -> None:
    import sglang

    with open(scenario_path, encoding="utf-8") as handle:
        scenario = json.load(handle)
    engine = sglang.Engine(
        model_path=scenario["model"],
        tokenizer_path=scenario["tokenizer"],
        **{**ENGINE_DEFAULTS, **scenario.get("engine", {})},
    )
    try:
        if scenario.get("serve"):
            serve(lambda: generate(engine, scenario["waves"]))
            return
        outputs = generate(engine, scenario["waves"])
    finally:
        engine.shutdown()
    with open(report_path, "w", encoding="utf-8") as handle:
        json.dump({"outputs": outputs, "pid": os.getpid()}, handle)


if __name__ == "__main__":
    main(*sys.argv[1:3])
