"""``msprobe-hooks recipe --backend B --gpus N``: the command around :mod:`msprobe_hooks.preflight.recipe`."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """\
Print the verl command-line overrides (stdout) and the exports that satisfy every preflight rule for
a job of this shape, with notes on what they change (stderr). Exit status: 0, or 2 for a layout that
cannot be paired. See docs/preflight.md."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from msprobe_hooks.preflight.vocabulary import ROLLOUT_BACKENDS, TRAINING_BACKENDS

    parser.add_argument("--backend", choices=TRAINING_BACKENDS, required=True, help="training backend")
    parser.add_argument("--gpus", type=int, required=True, help="cards (GPUs or NPUs) per node")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes (default 1)")
    parser.add_argument(
        "--rollout", choices=ROLLOUT_BACKENDS, help="inference engine (default: the one installed here)"
    )
    parser.add_argument("--generate-config", help="inference msprobe config.json (default: $MSPROBE_GENERATE_CONFIG)")
    parser.add_argument("--tp", type=int, default=1, help="Megatron: tensor parallel size of actor, ref and rollout")
    parser.add_argument("--ep", type=int, default=1, help="Megatron: expert parallel size of actor, ref and rollout")


def run(args: argparse.Namespace) -> int:
    from msprobe_hooks import config
    from msprobe_hooks.preflight.recipe import build, default_rollout_backend, lines

    try:
        recipe = build(
            args.backend,
            args.gpus,
            nnodes=args.nnodes,
            rollout=args.rollout or default_rollout_backend(),
            generate_config=args.generate_config or config.load().generate_config,
            tensor_parallel=args.tp,
            expert_parallel=args.ep,
        )
    except ValueError as exc:
        print(f"msprobe-hooks recipe: error: {exc}", file=sys.stderr)
        return 2
    for note in recipe.notes:
        print(f"# {note}", file=sys.stderr)
    for line in lines(recipe):
        print(line)
    return 0
