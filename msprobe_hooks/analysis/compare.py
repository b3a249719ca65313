"""``msprobe-hooks compare pairs.jsonl -o report/`` (DESIGN.md §6)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pairs", help="the pairs file written by align")
    parser.add_argument("-o", "--output", default="report", help="the report folder (default report/)")


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError("compare")
