"""``msprobe-hooks align TRAIN_DIR GENERATE_DIR -o pairs.jsonl`` (DESIGN.md §6)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("train_dir", help="the training dump root (the actor config's dump_path)")
    parser.add_argument("generate_dir", help="the inference dump root (the generate config's dump_path)")
    parser.add_argument("-o", "--output", default="pairs.jsonl", help="the pairs file to write (default pairs.jsonl)")


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError("align")
