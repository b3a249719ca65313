"""Why a dumped inference step is in no pair, once both joins have run."""

from __future__ import annotations

from msprobe_hooks.analysis.pairing.candidates import generate_dump, has_prefill, line_key
from msprobe_hooks.analysis.pairing.join import Join
from msprobe_hooks.analysis.pairing.logs import GenerateStep
from msprobe_hooks.analysis.results import Unpaired


def generate_reason(join: Join, step: GenerateStep) -> Unpaired:
    """Why ``step`` (dumped, in no pair) did not pair: what a join refused it for, its dump failing, else what
    its rows are."""
    refused = join.ledger.refused.get(line_key(step))
    if refused is not None:
        return refused
    if join.probe.failed(generate_dump(step)):
        return Unpaired.DUMP_UNREADABLE
    return _prefill_reason(join, step) if has_prefill(step) else _decode_reason(join, step)


def _prefill_reason(join: Join, step: GenerateStep) -> Unpaired:
    fulls = [row for row in step.rows if row.full is not False]
    if not fulls:
        return Unpaired.NOT_FULL_PREFILL
    if len(step.rows) > 1 and not any(join.filtered(step, row) for row in fulls):
        return Unpaired.MULTI_REQUEST
    if any((row.base or row.prompt_hash) in join.ledger.paired_requests for row in fulls):
        return Unpaired.REPLICA
    return Unpaired.NO_COUNTERPART


def _decode_reason(join: Join, step: GenerateStep) -> Unpaired:
    if line_key(step) in join.ledger.past:
        return Unpaired.PAST_RESPONSE
    bases = {row.base for row in step.rows if row.base is not None}
    train_bases = join.index.train_bases
    if bases and train_bases is not None and not bases & train_bases:
        return Unpaired.NO_COUNTERPART
    return Unpaired.DECODE_ONLY
