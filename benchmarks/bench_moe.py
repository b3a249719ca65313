"""``compare`` on Qwen3-MoE pairs: the time per pair, and what the routing comparison costs of it.

    python benchmarks/bench_moe.py [PAIRS_FILE]

Without a pairs file: the golden Qwen3-MoE trees (``tests/golden/moe``: real verl FSDP2 dumps in tensor
mode against real vLLM statistics with its ``routed_experts.jsonl``; the router-fault copy), aligned here;
``make demo-moe`` leaves bigger pairs (52 tokens) under ``examples/msprobe_dump/moe/*/pairs.jsonl``. Timed:
the CLI over all pairs, a fresh process as a user runs it (``--jobs 1``), per pair; in this process, per
pair, ``compare_pair`` whole and with the routing comparison left out (``routing.compare`` replaced by a no-op
for the measurement), and ``routing.compare`` alone. Medians of ``ROUNDS``; prints seconds and shares, no
pass/fail.

Then what the training side's routers' record costs a dumped window (``msprobe_hooks.training.routed_experts``): a
forward of the kit's Qwen3-MoE (``cpu_kit/moe_inputs.py``, ``RECORD_LAYERS`` layers) over ``RECORD_TOKENS`` tokens,
alone and with the routers watched, and the window's line written after it, per window and per token and layer.

And SGLang's (``msprobe_hooks.inference.routed_experts.bind_topk_modules``), whose forward hook runs in every forward
once a dump is configured: ``RECORD_LAYERS`` top-k modules as SGLang's ``TopK`` (its class name and output fields;
SGLang does not run in this venv), a decode step of ``DECODE_TOKENS`` tokens alone and hooked (its outputs kept, then
dropped: a forward not dumped), and a dumped forward's line over ``RECORD_TOKENS`` tokens.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # cpu_kit
ROUNDS = 7
RECORD_TOKENS = 2048
RECORD_LAYERS = 4
DECODE_TOKENS = 32  # a decode step's batch
DECODE_REPEAT = 200
EXPERTS, TOP_K = 8, 2  # the kit's Qwen3-MoE


def _golden_pairs(folder: Path) -> Path:
    pairs_file = folder / "pairs.jsonl"
    moe = REPO / "tests" / "golden" / "moe"
    command = [sys.executable, "-m", "msprobe_hooks", "align", str(moe / "actor"), str(moe / "router" / "generate")]
    subprocess.run([*command, "-o", str(pairs_file)], check=True, capture_output=True, cwd=REPO)
    return pairs_file


def _median(work, rounds: int = ROUNDS) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    from msprobe_hooks.analysis.comparing import compare, names, routing
    from msprobe_hooks.analysis.pairing import pairs

    with tempfile.TemporaryDirectory(prefix="bench-moe-") as folder:
        pairs_file = Path(sys.argv[1]) if len(sys.argv) > 1 else _golden_pairs(Path(folder))
        found = list(pairs.read(str(pairs_file)))
        command = [sys.executable, "-m", "msprobe_hooks", "compare", str(pairs_file), "--jobs", "1"]
        cli = _median(
            lambda: subprocess.run([*command, "-o", str(Path(folder) / "r")], check=True, capture_output=True), 3
        )
        table = names.load()

        def whole() -> None:
            for i, pair in enumerate(found):
                compare.compare_pair(i, pair)

        real_compare = routing.compare
        whole()  # warm: torch imported, the map loaded
        with_routing = _median(whole)
        routing.compare = lambda *args, **kwargs: None
        try:
            without = _median(whole)
        finally:
            routing.compare = real_compare
        outcomes = [compare.compare_pair(i, pair) for i, pair in enumerate(found)]
        # What compare's pass over each pair's dumps hands routing: their router entries.
        routers = [
            (
                compare.read_side(pair.train.dump, table, pair.train.layer_offset or 0).routers,
                compare.read_side(pair.generate.dump, table).routers,
            )
            for pair in found
        ]

        def judged() -> None:
            for (result, rows), pair, (train, generate) in zip(outcomes, found, routers, strict=True):
                routing.compare(result, pair, rows, table, train, generate)

        alone = _median(judged)
    n = len(found)
    layers = sum(r.routing_layers or 0 for r, _ in outcomes)
    print(f"pairs: {n} ({pairs_file.name}), MoE layers routed: {layers}")
    print(f"CLI, one process (imports, report): {cli:.2f} s, {cli / n:.3f} s per pair")
    print(f"in process, per pair: {with_routing / n * 1e3:.1f} ms with routing, {without / n * 1e3:.1f} ms without")
    print(
        f"routing.compare alone: {alone / n * 1e3:.1f} ms per pair "
        f"({alone / with_routing:.0%} of compare_pair; {alone / max(layers, 1) * 1e3:.2f} ms per MoE layer)"
    )
    _record_cost()
    _sglang_record_cost()
    return 0


def _record_cost() -> None:
    """The training record's cost: a forward with and without the routers watched, and the line written after it."""
    import torch
    from transformers import Qwen3MoeForCausalLM

    from cpu_kit import moe_inputs
    from msprobe_hooks.training.routed_experts import RouterWatch

    with tempfile.TemporaryDirectory(prefix="bench-moe-model-") as folder:
        path = moe_inputs.build_qwen3_moe_dir(os.path.join(folder, "moe"), layers=RECORD_LAYERS)
        model = Qwen3MoeForCausalLM.from_pretrained(path).eval()
    config = model.config
    tokens = torch.randint(0, config.vocab_size, (1, RECORD_TOKENS))
    with tempfile.TemporaryDirectory(prefix="bench-moe-record-") as folder:
        watch = RouterWatch(lambda cfg: folder)
        step = [0]

        def forward() -> None:
            with torch.no_grad():
                model(tokens)

        def window() -> None:
            watch.watch(None, model)
            forward()
            step[0] += 1
            watch.write(step[0], 0, 1)

        def written() -> None:  # the line alone: the forward's outputs kept by a watch, then written
            watch.watch(None, model)
            forward()
            began = time.perf_counter()
            watch.write(step[0], 0, 1)
            written_s.append(time.perf_counter() - began)

        forward()
        plain, watched = _median(forward), _median(window)
        written_s: list[float] = []
        for _ in range(ROUNDS):
            written()
        line = statistics.median(written_s)
        size = (Path(folder) / next(p.name for p in Path(folder).iterdir()) / "routed_experts.jsonl").stat().st_size
        lines = 2 * ROUNDS
    cells = RECORD_TOKENS * RECORD_LAYERS
    print(
        f"training routers' record, Qwen3-MoE {RECORD_LAYERS} layers x {RECORD_TOKENS} tokens: forward "
        f"{plain * 1e3:.1f} ms alone, {watched * 1e3:.1f} ms watched and written ({watched / plain:.2f}x); the line "
        f"{line * 1e3:.1f} ms, {line / cells * 1e6:.2f} us and {size / lines / cells:.0f} bytes per token and layer"
    )


def _sglang_record_cost() -> None:
    """SGLang's record: the TopK hooks' cost in a forward not dumped, and a dumped forward's line."""
    from typing import NamedTuple

    import torch

    from msprobe_hooks.inference.dispatch_log import ScheduledRequest
    from msprobe_hooks.inference.routed_experts import RoutingRecorder, bind_topk_modules

    class Output(NamedTuple):  # SGLang's StandardTopKOutput
        topk_weights: torch.Tensor
        topk_ids: torch.Tensor
        router_logits: torch.Tensor

    class TopK(torch.nn.Module):  # the class name the binding looks for
        def forward(self, logits: torch.Tensor) -> Output:
            weights, ids = logits.softmax(-1).topk(TOP_K)
            return Output(weights, ids, logits)

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(torch.nn.Module() for _ in range(RECORD_LAYERS))
    for layer in model.layers:
        layer.topk = TopK()
    decode, prefill = torch.randn(DECODE_TOKENS, EXPERTS), torch.randn(RECORD_TOKENS, EXPERTS)

    def forward(logits: torch.Tensor) -> None:
        with torch.no_grad():
            for layer in model.layers:
                layer.topk(logits)

    def decodes() -> None:  # a round is DECODE_REPEAT steps: one step is too short to time alone
        for _ in range(DECODE_REPEAT):
            forward(decode)
            recorder.discard()  # a forward not dumped drops what it kept (nothing before the binding)

    recorder = RoutingRecorder(tempfile.gettempdir())  # bound below; writes nothing here
    plain = _median(decodes) / DECODE_REPEAT
    with tempfile.TemporaryDirectory(prefix="bench-moe-sglang-") as folder:
        recorder = RoutingRecorder(folder)
        bind_topk_modules(model, recorder)
        hooked = _median(decodes) / DECODE_REPEAT
        rows = [ScheduledRequest("r", "r", True, RECORD_TOKENS, 0, RECORD_TOKENS, None)]
        lines = []
        for step in range(ROUNDS):
            forward(prefill)
            began = time.perf_counter()
            recorder.flush(step, 0, True, rows)
            lines.append(time.perf_counter() - began)
    line, cells = statistics.median(lines), RECORD_TOKENS * RECORD_LAYERS
    print(
        f"SGLang routers' record, {RECORD_LAYERS} TopK modules: a {DECODE_TOKENS}-token forward not dumped "
        f"{plain * 1e6:.0f} us alone, {hooked * 1e6:.0f} us hooked (+{(hooked - plain) / RECORD_LAYERS * 1e6:.1f} us a "
        f"layer); a dumped forward's line over {RECORD_TOKENS} tokens {line * 1e3:.1f} ms, "
        f"{line / cells * 1e6:.2f} us per token and layer"
    )


if __name__ == "__main__":
    sys.exit(main())
