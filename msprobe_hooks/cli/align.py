"""``msprobe-hooks align TRAIN_DIR GENERATE_DIR -o pairs.jsonl``: the command around :mod:`.analysis.pairing.align`."""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

DESCRIPTION = """\
Pair each training dump of one prompt (PROMPTS_ONLY=1) with the inference dump of that prompt's
full prefill, by request id (the engine's suffix stripped), else by the hash of the prompt's token
ids. Reads TRAIN_DIR/{pid}/update_actor_log.jsonl and GENERATE_DIR/{pid}/dispatch_log.jsonl and the
dump.json files they name; writes one JSON line per pair (the input of `msprobe-hooks compare`) and
prints what it could not pair, by reason. Exit status: 0 pairs written, 1 nothing paired, 2 bad input.
See docs/analysis.md."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from msprobe_hooks.analysis.pairing.align import BACKENDS

    parser.add_argument("train_dir", help="the training dump root (the actor config's dump_path)")
    parser.add_argument("generate_dir", help="the inference dump root (the generate config's dump_path)")
    parser.add_argument("-o", "--output", default="pairs.jsonl", help="the pairs file to write (default pairs.jsonl)")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=BACKENDS[0],
        help="the training engine, for the rank mapping: fsdp (default) pairs with the equal generate rank, "
        "else the lowest; megatron only with the equal rank",
    )
    parser.add_argument(
        "--generate-config",
        metavar="CONFIG_JSON",
        help="the inference msprobe config.json; a request_id in its task section marks packed steps "
        "holding that request as cut to it",
    )


def unpaired_table(train: Counter, generate: Counter) -> str:
    """The unpaired dumps of both sides, by reason, as text: laid out as pandas' ``DataFrame.to_string`` laid it
    out (the reasons left-aligned, each count right-aligned under its column's name, two spaces apart)."""
    from msprobe_hooks.analysis.results import Unpaired

    reasons = [r for r in Unpaired if train[r] or generate[r]]
    columns = {
        "training dumps": [str(train[r]) for r in reasons],
        "generate dumps": [str(generate[r]) for r in reasons],
    }
    left = max(len(r.value) for r in reasons)
    widths = {name: max(len(name), *map(len, cells)) for name, cells in columns.items()}
    lines = [" " * left + "".join(f"  {name:>{widths[name]}}" for name in columns)]
    for i, reason in enumerate(reasons):
        lines.append(
            reason.value.ljust(left) + "".join(f"  {cells[i]:>{widths[name]}}" for name, cells in columns.items())
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from msprobe_hooks.analysis.layout import find_logs
    from msprobe_hooks.analysis.pairing import pairs
    from msprobe_hooks.analysis.pairing.align import config_request_ids, pair_logs
    from msprobe_hooks.analysis.pairing.ranks import replica_lines
    from msprobe_hooks.join_keys import DISPATCH_LOG, TRAINING_LOG

    def fail(message: str) -> int:
        print(f"msprobe-hooks align: {message}", file=sys.stderr)
        return 2

    found = {}
    for name, root, filename, what in (
        ("TRAIN_DIR", args.train_dir, TRAINING_LOG, "the actor config's dump_path"),
        ("GENERATE_DIR", args.generate_dir, DISPATCH_LOG, "the generate config's dump_path"),
    ):
        if not os.path.isdir(root):
            return fail(f"{name} {root!r} is not a directory; expected {what}")
        found[name] = find_logs(root, filename)
        if not found[name]:
            return fail(f"{name} {root!r} holds no {{pid}}/{filename}; expected {what}")
    try:
        ids = config_request_ids(args.generate_config) if args.generate_config else frozenset()
    except ValueError as exc:
        return fail(str(exc))
    out_dir = os.path.dirname(os.path.abspath(args.output))
    result = pair_logs(found["TRAIN_DIR"], found["GENERATE_DIR"], out_dir, args.backend, ids)
    os.makedirs(out_dir, exist_ok=True)
    pairs.write(result.pairs, args.output)
    rules = Counter(pair.rule for pair in result.pairs)
    by_rule = ", ".join(f"{rule}: {rules[rule]}" for rule in pairs.JoinRule if rules[rule])
    print(
        f"align: {len(result.pairs)} pairs{f' ({by_rule})' if by_rule else ''} from {result.train_total} "
        f"training dumps and {result.generate_total} generate dumps -> {args.output}"
    )
    for line in replica_lines(result.pairs):
        print(line)
    if result.train_unpaired or result.generate_unpaired:
        print("unpaired, by reason:")
        print(unpaired_table(result.train_unpaired, result.generate_unpaired))
    if result.problems:
        print(f"{result.problems} bad log lines or dump files, each named above on stderr")
    if not result.pairs:
        why = ", ".join(f"{n} {reason}" for reason, n in result.train_unpaired.most_common())
        why = f"of {result.train_total} training dumps: {why}" if why else "the training logs list no dump"
        print(f"msprobe-hooks align: nothing paired ({why}); docs/analysis.md says what a pair needs", file=sys.stderr)
        return 1
    return 0
