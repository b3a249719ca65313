"""Real pairs, and larger dumps built from them, for the compare benchmarks (no engine needed).

The real pairs are the golden verdict set's (``tests/golden/verdict``: verl's FSDP2 engine in fp32 against
vLLM's CPU engine in fp32 and bf16, the demo's 4-layer model, 4 prompts, clean and with one weight scaled),
aligned as ``msprobe-hooks align`` does. A deeper model's dump repeats a real dump's decoder-layer entries
under new layer numbers (layer ``k`` of the new model is layer ``k mod 4`` of the real one), the entries
before and after the layers kept once.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from msprobe_hooks.analysis.layout import find_logs
from msprobe_hooks.analysis.pairing import align, pairs
from msprobe_hooks.join_keys import DISPATCH_LOG, TRAINING_LOG

REPO = Path(__file__).resolve().parent.parent
VERDICT = REPO / "tests" / "golden" / "verdict"
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def real_pairs(out_dir: Path) -> list[pairs.Pair]:
    """Every real pair of the golden verdict set (4 per case), interleaved: pair ``i`` is from case ``i mod cases``,
    so the first few pairs are of as many cases (clean and faulty, fp32 and bf16). ``out_dir``: the folder of the
    pairs file they will be written to (the dump paths are relative to it when under it)."""
    train = find_logs(str(VERDICT / "actor"), TRAINING_LOG)
    per_case = []
    for case in sorted(p for p in VERDICT.iterdir() if (p / "generate").is_dir()):
        per_case.append(align.pair_logs(train, find_logs(str(case / "generate"), DISPATCH_LOG), str(out_dir)).pairs)
    interleaved = [pair for group in zip(*per_case, strict=True) for pair in group]
    return renumbered(interleaved, len(interleaved))


def renumbered(pair_list: list[pairs.Pair], count: int) -> list[pairs.Pair]:
    """``count`` pairs: ``pair_list`` repeated as often as needed, numbered 0, 1, ..."""
    return [dataclasses.replace(pair_list[i % len(pair_list)], pair=i) for i in range(count)]


def _entries(template: str) -> tuple[dict[str, Any], list[tuple[str, Any]], dict[int, list[tuple[str, Any]]], list]:
    """A dump.json's fields, and its entries: before the decoder layers, per layer, after them."""
    data = json.loads(Path(template).read_text())
    before: list[tuple[str, Any]] = []
    layers: dict[int, list[tuple[str, Any]]] = {}
    after: list[tuple[str, Any]] = []
    for name, entry in data.pop("data").items():
        found = _LAYER.search(name)
        if found:
            layers.setdefault(int(found.group(1)), []).append((name, entry))
        else:
            (after if layers else before).append((name, entry))
    return data, before, layers, after


def deeper(template: str, path: Path, layers: int) -> None:
    """``template``'s dump.json as the dump of a model of ``layers`` decoder layers, written to ``path``."""
    fields, before, by_layer, after = _entries(template)
    sources = sorted(by_layer)

    def entries() -> Iterator[tuple[str, Any]]:
        yield from before
        for layer in range(layers):
            for name, entry in by_layer[sources[layer % len(sources)]]:
                yield _LAYER.sub(f".layers.{layer}.", name, count=1), entry
        yield from after

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        out.write(json.dumps(fields)[:-1] + ', "data": {')
        for i, (name, entry) in enumerate(entries()):
            out.write(("," if i else "") + json.dumps(name) + ":" + json.dumps(entry, separators=(",", ":")))
        out.write("}}")


def deeper_pairs(pair_list: list[pairs.Pair], folder: Path, layers: int) -> list[pairs.Pair]:
    """The same pairs with each dump replaced by its ``layers``-layer version under ``folder``."""
    made: dict[str, str] = {}

    def version(dump: str) -> str:
        if dump not in made:
            target = folder / f"{len(made)}" / "dump.json"
            deeper(dump, target, layers)
            made[dump] = str(target)
        return made[dump]

    return [
        dataclasses.replace(
            p,
            train=dataclasses.replace(p.train, dump=version(p.train.dump)),
            generate=dataclasses.replace(p.generate, dump=version(p.generate.dump)),
        )
        for p in pair_list
    ]
