"""``msprobe-hooks compare`` against ``msprobe compare --consistent_check``, per pair, on the same real pairs.

    python benchmarks/bench_compare.py [PAIRS_FILE]

Without a pairs file, real pairs are made first (verl's FSDP2 engine and vLLM's CPU engine, four
prompts, as tests/analysis/test_compare.py makes them; about a minute). Timed, wall clock, each a fresh
process as a user runs it: our CLI over all pairs (one process, ``--jobs 1`` so the ratio is not
a core count) divided by the number of pairs, and msprobe's CLI once per pair (it takes one pair
per call); our CLI again over the pairs repeated ten times (start-up shared, as in a real job).
Also the in-process time per pair (no interpreter start-up or imports), and the peak memory of
reading one ~200 MB dump.json (the first pair's inference dump, repeated) against json.load. Prints
seconds and the ratio; no pass/fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MANY = 10
LARGE_MB = 200
TEMPLATE_LAYERS = 1000  # layer k of copy c becomes layer c * 1000 + k
_LAYER = re.compile(r"layers\.(\d+)")


def _make_pairs(folder: Path) -> Path:
    sys.path[:0] = [str(REPO), str(REPO / "tests")]  # cpu_kit, support
    from support import compare_runs

    from cpu_kit.demo_inputs import build_models, write_prompts

    model, _ = build_models(folder)
    prompts = write_prompts(folder / "prompts.jsonl")
    config = compare_runs.msprobe_config(folder / "config.json")
    train = compare_runs.run_training(folder / "train", model, prompts, config)
    generate = compare_runs.run_vllm(folder / "generate", model, prompts, config)
    compare_runs.align(train, generate, folder / "pairs.jsonl")
    return folder / "pairs.jsonl"


def _timed(command: list[str], check: bool = True) -> tuple[float, int]:
    """Wall-clock seconds and exit status of ``command``."""
    start = time.perf_counter()
    done = subprocess.run(command, check=check, capture_output=True, cwd=REPO)
    return time.perf_counter() - start, done.returncode


def _large_dump(template: str, path: Path, megabytes: int) -> int:
    """A dump.json of about ``megabytes``: the template's entries repeated as further layers; returns its layers."""
    data = json.loads(Path(template).read_text())
    entries = list(data.pop("data").items())
    copies = max(1, megabytes * 2**20 // len(json.dumps(entries)))
    with path.open("w") as out:
        out.write(json.dumps(data)[:-1] + ', "data": {')
        for copy in range(copies):
            for i, (name, entry) in enumerate(entries):
                name = _LAYER.sub(lambda m, c=copy: f"layers.{c * TEMPLATE_LAYERS + int(m.group(1))}", name)
                name = name if ".layers." in name else f"{name}.{copy}"  # unique names outside the layers too
                out.write(("," if copy or i else "") + json.dumps(name) + ": " + json.dumps(entry, indent=1))
        out.write("}}")
    return copies


def _peak_mb(code: str) -> float:
    """Peak resident memory of a fresh interpreter running ``code``, in MB."""
    probe = f"import resource\n{code}\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    done = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd=REPO)
    return int(done.stdout.split()[-1]) / 1024


def _memory(template: str, folder: Path) -> None:
    path = folder / "large.json"
    _large_dump(template, path, LARGE_MB)
    size = path.stat().st_size / 2**20
    imports = "import json\nfrom msprobe_hooks.analysis import compare, names"
    base = _peak_mb(imports)
    whole = _peak_mb(f"{imports}\njson.load(open({str(path)!r}))") - base
    ours = _peak_mb(f"{imports}\ncompare.read_side({str(path)!r}, names.load())") - base
    print(f"  peak memory on a {size:.0f} MB dump.json (the first pair's inference dump, repeated):")
    print(f"    json.load {whole:.0f} MB, compare's reader {ours:.0f} MB above the imports ({base:.0f} MB)")


def _ours(pairs_file: Path, out: Path) -> float:
    return _timed([str(BIN / "msprobe-hooks"), "compare", str(pairs_file), "-o", str(out), "--jobs", "1"])[0]


def main() -> int:
    import dataclasses

    from msprobe_hooks.analysis import compare, pairs
    from msprobe_hooks.analysis.results import DEFAULT_THRESHOLD

    folder = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    try:
        pairs_file = Path(sys.argv[1]) if len(sys.argv) > 1 else _make_pairs(folder)
        pair_list = list(pairs.read(str(pairs_file)))
        n = len(pair_list)
        ours = _ours(pairs_file, folder / "ours")
        # A job has many pairs: the same pairs ten times over shows the per-pair cost once start-up is shared.
        many = folder / "many.jsonl"
        pairs.write([dataclasses.replace(p, pair=i) for i, p in enumerate(pair_list * MANY)], str(many))
        ours_many = _ours(many, folder / "many")
        start = time.perf_counter()
        for i, pair in enumerate(pair_list):
            compare.compare_pair(i, pair, DEFAULT_THRESHOLD)
        in_process = (time.perf_counter() - start) / n
        theirs, failed = 0.0, 0
        for i, pair in enumerate(pair_list):
            out = folder / f"msprobe{i}"
            out.mkdir()
            seconds, status = _timed(
                [str(BIN / "msprobe"), "compare", "-tp", pair.train.dump, "-gp", pair.generate.dump,
                 "-o", str(out), "--consistent_check", "--backend", "fsdp"],
                check=False,  # it raises on level mix ("Conflicting comparison data"): timed all the same
            )  # fmt: skip
            theirs += seconds
            failed += status != 0
        print(f"{n} real pairs (verl FSDP2 vs vLLM CPU), {os.cpu_count()} cores")
        print(
            f"  msprobe compare --consistent_check: {theirs / n:.3f} s per pair (one process per pair; "
            f"failed on {failed} of {n})"
        )
        print(f"  msprobe-hooks compare --jobs 1:     {ours / n:.3f} s per pair (one process for all pairs)")
        print(f"  msprobe-hooks compare --jobs 1:     {ours_many / n / MANY:.3f} s per pair ({n * MANY} pairs)")
        print(f"  msprobe-hooks, in process:          {in_process * 1000:.1f} ms per pair (no start-up, no report)")
        cli, cli_many, direct = theirs / ours, theirs * MANY / ours_many, theirs / n / in_process
        print(
            f"  ratio msprobe / msprobe-hooks per pair: {cli:.1f}x (CLI, {n} pairs), {cli_many:.1f}x (CLI, "
            f"{n * MANY} pairs), {direct:.0f}x (in process)"
        )
        _memory(pair_list[0]["generate"]["dump"], folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
