"""Pairing training dumps with inference dumps (``msprobe-hooks align``; docs/analysis.md).

Pairs each training prompt-only dump with the inference dump of that prompt's full prefill:

* the join: by request id (the engine's suffix stripped) when both sides carry it, else by the
  prompt-token hash; equal prompts under different ids, or several requests with one prompt,
  are ambiguous and never paired;
* the inference step: one holding that request alone, or a packed step that msprobe's
  ``request_id`` filter cut to it (its dumped token count is that request's, or the generate
  config names it); other packed steps are reported, not paired;
* the rank: the generate rank equal to the training rank (the recipe's rule; Megatron needs it,
  TP/PP/EP being equal); with FSDP, whose training ranks hold whole activations, the lowest rank
  that dumped the prefill when no equal rank did (generate TP smaller than the number of cards).

A training dump of whole sequences (``DUMP_SEQUENCES=1``, or a micro-batch with its samples' offsets)
gives decode pairs too: each response token after the first against the inference row it was sampled
from (a decode row, or the last row of a recompute after a preemption), wherever a packed step put that
row; and its prompt's rows against a packed full prefill.

What is not paired is counted by reason, per side. A training dump two processes' logs name (two jobs on one
dump root, two processes that both took a rank: msprobe names step folders by rank only) is never paired.

:func:`pair_logs` runs the parts: :mod:`.candidates` (the logs read into an index), :mod:`.prefill` and
:mod:`.decode` (the two joins, over what :mod:`.join` holds for both), :mod:`.unpaired` (the generate side's
reasons); the dumps are read through :class:`~msprobe_hooks.analysis.dumpfile.DumpProbe`.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field

from msprobe_hooks.analysis.dumpfile import DumpProbe
from msprobe_hooks.analysis.pairing.candidates import CandidateIndex, line_key, train_dump
from msprobe_hooks.analysis.pairing.decode import DecodeJoin
from msprobe_hooks.analysis.pairing.join import BACKENDS, Join
from msprobe_hooks.analysis.pairing.pairs import Pair
from msprobe_hooks.analysis.pairing.prefill import PrefillJoin
from msprobe_hooks.analysis.pairing.unpaired import generate_reason
from msprobe_hooks.analysis.results import Unpaired
from msprobe_hooks.log import logger


@dataclass
class Result:
    """What one ``align`` run found."""

    pairs: list[Pair] = field(default_factory=list)
    train_total: int = 0
    generate_total: int = 0
    train_unpaired: Counter[Unpaired] = field(default_factory=Counter)
    generate_unpaired: Counter[Unpaired] = field(default_factory=Counter)
    problems: int = 0  # bad log lines and unreadable dumps, each reported on stderr

    def add(self, pairs: list[Pair]) -> None:
        """``pairs`` numbered in the order found."""
        for pair in pairs:
            pair.pair = len(self.pairs)
            self.pairs.append(pair)


def pair_logs(
    train_logs: list[str],
    dispatch_logs: list[str],
    out_dir: str,
    backend: str = BACKENDS[0],
    config_request_ids: frozenset[str] = frozenset(),
) -> Result:
    """One join of training logs with dispatch logs; ``out_dir`` is the pairs file's folder (the dumps are
    named relative to it when under it), ``config_request_ids`` the generate config's ``request_id`` filter."""
    result = Result()

    def warn(message: str) -> None:
        result.problems += 1
        logger().warning("align: %s", message)

    index = CandidateIndex.read(train_logs, dispatch_logs, warn)
    join = Join(index, DumpProbe(warn), warn, os.path.abspath(out_dir), backend, config_request_ids)
    prefill, decode = PrefillJoin(join), DecodeJoin(join)
    for dump in index.trains:
        result.train_total += 1
        if train_dump(dump) in index.overwritten:
            result.train_unpaired[Unpaired.OVERWRITTEN] += 1
            continue
        outcome: list[Pair] | Pair | Unpaired = prefill.match(dump)
        if outcome in (Unpaired.NOT_PROMPT_ONLY, Unpaired.MULTI_REQUEST):  # whole sequences, or several prompts
            outcome = decode.match(dump) or outcome
        if isinstance(outcome, Unpaired):
            result.train_unpaired[outcome] += 1
        else:
            result.add(outcome if isinstance(outcome, list) else [outcome])
    for step in index.steps:
        if step.dumped is False:
            continue
        result.generate_total += 1
        if line_key(step) not in join.ledger.used:
            result.generate_unpaired[generate_reason(join, step)] += 1
    return result


def config_request_ids(path: str) -> frozenset[str]:
    """The request ids of an msprobe config's ``request_id`` filter (its task section); ValueError if unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except OSError as exc:
        raise ValueError(f"--generate-config {path}: cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--generate-config {path}: not JSON ({exc.msg}); expected an msprobe config.json") from None
    section = config.get(config.get("task", "statistics")) if isinstance(config, dict) else None
    value = section.get("request_id") if isinstance(section, dict) else None
    if value is None:
        return frozenset()
    return frozenset(str(v) for v in (value if isinstance(value, list) else [value]))
