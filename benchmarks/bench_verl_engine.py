"""Cost of the verl engine patch, on verl's real FSDP2 engine on CPU. Prints medians and ratios.

1. A dump made by the patch (``DUMP_ON=1``) against the same dump made by hand-inserted
   ``PrecisionDebugger`` calls placed where the published recipe places them: ``start(model)``
   before each micro-batch's ``forward_step``, ``stop()``/``step()`` and a JSON log line after it
   (after its backward in an update). Both dump every micro-batch of every log-prob and update
   pass with the same msprobe config and debugger; passes without any dump give the baseline.
   Target: the patch within 5 % of the hand-made dump.
2. The wrapper's cost on a micro-batch whose phase is not selected (``forward_step`` called in a
   pass that is not dumped), measured on a trivial ``forward_step`` so that only the wrapper is
   timed. Target: at most 2 µs per call.

    python benchmarks/bench_verl_engine.py [--passes 15]

The engine runs in a child process; the variants' passes are interleaved there, round by round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the repository root: cpu_kit


def _engine_timings(model_dir: str, passes: int, out_dir: str) -> dict[str, dict[str, list[float]]]:
    """Seconds per log-prob pass and per update pass for each variant, rounds interleaved.

    One process, one msprobe debugger (it is a process singleton): each round runs a pass of
    every variant in rotating order, so that load from other processes hits all of them alike.
    "baseline" dumps nothing, but msprobe exists (idle) as in the two others.
    """
    from msprobe_hooks import bootstrap

    bootstrap.activate(
        {"DUMP_ON": "1", "DUMP_PHASE": "all", "MSPROBE_HOOKS_OUTPUT_DIR": out_dir, "MSPROBE_HOOKS_LOG_LEVEL": "ERROR"}
    )
    from cpu_kit import verl_cpu

    verl_cpu.init_process()
    engine = verl_cpu.make_engine(model_dir)
    from verl.workers.engine.fsdp import transformer_impl

    from msprobe_hooks import patching
    from msprobe_hooks.patches.verl import VERL_FSDP_ENGINE
    from msprobe_hooks.training.actor_dump import dumper

    actor_dumper = dumper()
    recipe = _RecipeCalls(engine, actor_dumper.debugger(bootstrap.current_config()), os.path.join(out_dir, "hand"))
    own_work: list[float] = []  # the patch's log line: reading the samples, hashing prompts, writing
    write = actor_dumper._write

    def timed_write(window: object, debugger: object) -> None:
        begin = time.perf_counter()
        write(window, debugger)
        own_work.append(time.perf_counter() - begin)

    actor_dumper._write = timed_write
    samples = verl_cpu.random_samples(8, 0, prompt_lens=(32, 48, 40, 56), response_lens=(24, 32))
    variants = ("baseline", "hand", "patch")
    timings: dict[str, dict[str, list[float]]] = {v: {"log_prob": [], "update": []} for v in variants}
    for round_ in range(passes + 1):  # round 0 warms up
        for variant in variants[round_ % 3 :] + variants[: round_ % 3]:
            if variant != "patch":
                patching.revert(VERL_FSDP_ENGINE.name)
            if variant == "hand":
                recipe.install()
            try:
                start = time.perf_counter()
                verl_cpu.log_probs(engine, verl_cpu.make_batch(samples))
                middle = time.perf_counter()
                verl_cpu.update(engine, verl_cpu.make_batch(samples))
                end = time.perf_counter()
            finally:
                recipe.remove()
                patching.apply(VERL_FSDP_ENGINE, transformer_impl, config=bootstrap.current_config())
            if round_:
                timings[variant]["log_prob"].append(middle - start)
                timings[variant]["update"].append(end - middle)
    timings["patch"]["log_line"] = own_work[len(own_work) // (passes + 1) :]  # without the warm-up round
    return timings


class _RecipeCalls:
    """The published recipe's PrecisionDebugger calls, as plain function replacements on one engine."""

    def __init__(self, engine: object, debugger: object, log_dir: str) -> None:
        self.engine, self.debugger = engine, debugger
        os.makedirs(log_dir, exist_ok=True)
        self.log = open(os.path.join(log_dir, "update_actor_log.jsonl"), "a")  # noqa: SIM115  (open for the run)
        self.pending: list[object] = []

    def finish(self) -> None:
        from verl.utils import tensordict_utils as tu

        if self.pending:
            micro_batch = self.pending.pop()
            self.debugger.stop()
            self.debugger.step()
            request_ids = tu.get(micro_batch, "request_id", default=None) or []
            record = {
                "source": "update_actor",
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime()),
                "pid": os.getpid(),
                "rank": self.engine.rank,
                "step": self.debugger.service.current_iter,
                "request_ids": [str(r) for r in request_ids],
                "num_requests": len(request_ids),
            }
            self.log.write(json.dumps(record) + "\n")
            self.log.flush()

    def install(self) -> None:
        engine, original_step, original_batch = (
            self.engine,
            self.engine.forward_step,
            self.engine.forward_backward_batch,
        )

        def forward_step(micro_batch, loss_function, forward_only):
            self.finish()  # the previous micro-batch's backward has run by now
            self.debugger.start(model=engine.module)
            self.pending.append(micro_batch)
            result = original_step(micro_batch, loss_function=loss_function, forward_only=forward_only)
            if forward_only:
                self.finish()
            return result

        def forward_backward_batch(data, loss_function, forward_only=False):
            try:
                return original_batch(data, loss_function, forward_only=forward_only)
            finally:
                self.finish()

        engine.forward_step = forward_step
        engine.forward_backward_batch = forward_backward_batch

    def remove(self) -> None:
        vars(self.engine).pop("forward_step", None)
        vars(self.engine).pop("forward_backward_batch", None)


def _wrapper_cost(calls: int) -> dict[str, float]:
    """Seconds per call of forward_step / forward_backward_batch, patched vs not, in a pass not dumped."""
    from msprobe_hooks import bootstrap, patching
    from msprobe_hooks.patches.verl import VERL_FSDP_ENGINE
    from msprobe_hooks.training.actor_dump import Pass, dumper

    bootstrap.activate({"DUMP_ON": "1", "DUMP_PHASE": "update_actor", "MSPROBE_HOOKS_LOG_LEVEL": "ERROR"})

    class FSDPEngine:
        engine_config = types.SimpleNamespace(forward_only=False)

        def forward_backward_batch(self, data, loss_function, forward_only=False):
            return None

    class FSDPEngineWithLMHead(FSDPEngine):
        def forward_step(self, micro_batch, loss_function, forward_only):
            return None

    class FSDPEngineWithValueHead(FSDPEngineWithLMHead):
        pass

    module = types.SimpleNamespace(
        FSDPEngine=FSDPEngine,
        FSDPEngineWithLMHead=FSDPEngineWithLMHead,
        FSDPEngineWithValueHead=FSDPEngineWithValueHead,
    )
    engine = FSDPEngineWithLMHead()

    def per_call(statement) -> float:
        return min(timeit.repeat(statement, number=calls, repeat=7)) / calls

    plain_step = per_call(lambda: engine.forward_step(None, None, True))
    plain_batch = per_call(lambda: engine.forward_backward_batch(None, None, True))
    ctx = patching.apply(VERL_FSDP_ENGINE, module, config=bootstrap.current_config())
    dumper().current = Pass(engine, ctx, "log_prob", due=False)
    wrapped_step = per_call(lambda: engine.forward_step(None, None, True))
    dumper().current = None
    wrapped_batch = per_call(lambda: engine.forward_backward_batch(None, None, True))
    patching.revert(VERL_FSDP_ENGINE.name)
    return {
        "forward_step": wrapped_step - plain_step,
        "forward_backward_batch": wrapped_batch - plain_batch,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=10, help="timed log-prob + update rounds per variant")
    parser.add_argument("--calls", type=int, default=200_000, help="calls per timing of the wrapper cost")
    parser.add_argument("--child", nargs=2, metavar=("MODEL_DIR", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_engine_timings(args.child[0], args.passes, args.child[1])))
        return 0

    from cpu_kit import verl_cpu

    with tempfile.TemporaryDirectory(prefix="bench-verl-engine-") as tmp:
        model_dir = verl_cpu.build_model_dir(os.path.join(tmp, "model"), layers=4, hidden=128)
        env = {k: v for k, v in os.environ.items() if k not in ("DUMP_ON", "PYTHONPATH")}
        env["OMP_NUM_THREADS"] = "1"
        done = subprocess.run(
            [sys.executable, __file__, "--passes", str(args.passes), "--child", model_dir, os.path.join(tmp, "dumps")],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        results = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"verl FSDP2 engine on CPU, 4 layers, hidden 128, 8 samples in micro-batches of 2; {args.passes} rounds")
    print("every micro-batch of every pass dumped (default config: statistics, mix); medians per pass")
    print(f"{'pass':<10}{'no dump':>12}{'hand-made':>12}{'patch':>12}{'patch/hand':>12}{'hand/none':>11}")
    for phase in ("log_prob", "update"):
        base, hand, patch = (statistics.median(results[v][phase]) for v in ("baseline", "hand", "patch"))
        print(
            f"{phase:<10}{base * 1e3:>10.1f}ms{hand * 1e3:>10.1f}ms{patch * 1e3:>10.1f}ms"
            f"{patch / hand:>12.3f}{hand / base:>11.2f}"
        )
    log_line = statistics.median(results["patch"]["log_line"])
    print(f"the patch's own work per dumped micro-batch (its log line): {log_line * 1e3:.2f} ms")
    cost = _wrapper_cost(args.calls)
    print("wrapper cost in a pass that is not dumped (patched minus plain, per call):")
    for name, seconds in cost.items():
        print(f"  {name:<24}{seconds * 1e6:>8.3f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
