"""Drives the Megatron engine stand-in under the shim and writes what it saw, one JSON file per rank.

Run by ``tests/training/test_verl_megatron_standin.py`` as
``python tests/support/megatron_standin_child.py '<json spec>'`` (world size 1) or under ``torchrun``
(world size 2), with the stand-in served for verl's module name (:mod:`support.megatron_standin`).
The spec:

* ``samples``: ``count``/``seed``/``prompt_lens``/``response_lens`` of the global sample set (split over ranks);
  ``rollout_log_probs``: each carries the rollout's log-probs, ``-2 - 0.1 j`` for response token ``j``;
* ``keep``: ``{rank: n}``, that rank keeps only its first n samples;
* ``padding_on_rank``: this rank's last sample gets a verl padding uid (``pad…``);
* ``scenarios``: one pass each, in order: ``name``; ``engine``: ``value_head``, ``forward_only``
  (the ref engine), ``chunks``, ``pipeline`` (parallel size), ``router_replay`` (mode),
  ``dynamic_context_parallel``; ``trimmed`` (responses cut off, as the trainer's trim does);
  ``forward_only`` (default true: a log-prob pass; false: an update); ``grad`` (run a log-prob pass with grad
  enabled); ``middle_stage`` (not the last pipeline stage); ``flags`` (non-tensor batch fields);
* ``out``: the folder for the report.

Report ``{out}/rank{R}.json``: ``status`` (patch states), ``outcomes`` (``ok`` or ``refused: …``),
``forwards`` (per scenario, each call of a model chunk: input shape and whether grad was enabled)
and ``outputs`` (per scenario, each micro-batch's real model output, as lists).
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from dataclasses import replace
from pathlib import Path

SPEC = json.loads(sys.argv[1])
# Run as a file: the repository root (cpu_kit) and tests/ (support) go on sys.path.
sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]

import torch  # noqa: E402

from cpu_kit import verl_cpu  # noqa: E402
from msprobe_hooks import patching  # noqa: E402
from msprobe_hooks.training.actor_dump import DumpRefused  # noqa: E402
from support.megatron_standin import TARGET  # noqa: E402
from support.megatron_standin import install as install_standin  # noqa: E402


def _plain(model_output: dict) -> list:
    """The one tensor of a micro-batch's model output (log-probs, jagged; or values) as a list."""
    (tensor,) = model_output.values()
    return (tensor.values() if tensor.is_nested else tensor).tolist()


def loss_function(**kwargs):
    raise AssertionError("the stand-in computes its own loss")


def main() -> None:
    rank, world_size = verl_cpu.init_process()
    install_standin()
    standin = importlib.import_module(TARGET)  # through the activation's import hooks, as in a job

    rows = SPEC.get("samples", {})
    samples = verl_cpu.random_samples(
        rows.get("count", 4),
        rows.get("seed", 0),
        prompt_lens=rows.get("prompt_lens", (5, 7, 4, 6)),
        response_lens=rows.get("response_lens", (3, 4)),
    )
    if rows.get("rollout_log_probs"):
        samples = [replace(s, rollout_log_probs=tuple(-2.0 - 0.1 * j for j in range(len(s.response)))) for s in samples]
    mine = verl_cpu.shard(samples, rank, world_size)[: SPEC.get("keep", {}).get(str(rank))]
    if SPEC.get("padding_on_rank") == rank:
        mine[-1] = verl_cpu.Sample(mine[-1].prompt, mine[-1].response, uid="pad0c0ffee", session_id=0)
    trimmed = [verl_cpu.Sample(s.prompt, (), s.uid, s.session_id, s.request_id) for s in mine]

    outcomes, forwards, outputs = {}, {}, {}
    for scenario in SPEC["scenarios"]:
        name, setup = scenario["name"], scenario.get("engine", {})
        config = types.SimpleNamespace(
            forward_only=setup.get("forward_only", False),
            pipeline_model_parallel_size=setup.get("pipeline", 1),
            dynamic_context_parallel=setup.get("dynamic_context_parallel", False),
            router_replay=types.SimpleNamespace(mode=setup.get("router_replay", "disabled")),
        )
        chunks = [standin.make_chunk(i) for i in range(setup.get("chunks", 1))]
        calls = forwards[name] = []

        def record(module, inputs, output, calls=calls):
            calls.append([list(inputs[0].shape), torch.is_grad_enabled()])

        for chunk in chunks:
            chunk.register_forward_hook(record)
        cls = standin.MegatronEngineWithValueHead if setup.get("value_head") else standin.MegatronEngineWithLMHead
        engine = cls(config, chunks)
        batch = verl_cpu.make_batch(trimmed if scenario.get("trimmed") else mine, **scenario.get("flags", {}))
        forward_only = scenario.get("forward_only", True)
        standin.mpu.last_stage = not scenario.get("middle_stage", False)
        try:
            with torch.enable_grad() if not forward_only or scenario.get("grad") else torch.no_grad():
                metas = engine.forward_backward_batch(batch, None if forward_only else loss_function, forward_only)
            outcomes[name] = "ok"
            outputs[name] = [_plain(meta["model_output"]) for meta in metas]
        except DumpRefused as exc:
            outcomes[name] = "refused: " + str(exc)
        finally:
            standin.mpu.last_stage = True

    report = {
        "rank": rank,
        "status": {s.name: s.state for s in patching.status()},
        "outcomes": outcomes,
        "forwards": forwards,
        "outputs": outputs,
    }
    Path(SPEC["out"], f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
