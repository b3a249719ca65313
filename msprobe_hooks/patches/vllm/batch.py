"""Reading a vLLM model step: the scheduled requests in packed order, and whether the engine is eager."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from msprobe_hooks.inference.dispatch_log import (
    DeferredRows,
    ScheduledRequest,
    make_scheduled_request,
    rows_of_columns,
)
from msprobe_hooks.patches.vllm.runner_state import VllmRunner


def scheduled_requests(runner: Any, scheduler_output: Any, state: VllmRunner) -> Sequence[ScheduledRequest]:
    """The step's requests in packed order: ``input_batch`` rows as ``_update_states`` left them, made when first
    read (:class:`DeferredRows`)."""
    last_new, state.last_new = state.last_new, None
    if last_new is not None:
        last_new.made()  # what its new requests are (client ids, prompt hashes): this step's rows need them
    batch = runner.input_batch
    request_ids = batch.req_ids
    rows = len(request_ids)
    computed = batch.num_computed_tokens_cpu[:rows].tolist()  # one conversion, not one per row
    tokens = scheduler_output.num_scheduled_tokens
    # _update_states drops the rows not scheduled: as many scheduled as rows is every row scheduled
    if rows and not scheduler_output.scheduled_new_reqs and len(tokens) == rows:
        running = _running_rows(batch, request_ids, computed, tokens, state)
        if running is not None:
            return running
    state.last_batch = None
    prompt_lens = batch.num_prompt_tokens[:rows].tolist()
    new_ids = {new.req_id for new in scheduler_output.scheduled_new_reqs}
    held = runner.requests
    columns = []
    for request_id, done, prompt_len in zip(request_ids, computed, prompt_lens, strict=True):
        scheduled = tokens.get(request_id)
        if scheduled:  # the prompt's list taken now: the request may be over and gone when the rows are made
            prompt = getattr(held.get(request_id), "prompt_token_ids", None)
            columns.append((request_id, request_id in new_ids, scheduled, done, prompt_len, prompt))
    if len(state.known) > 2 * len(held) + 64:  # finished requests piled up
        state.known = {k: v for k, v in state.known.items() if k in held}
    state.prompts.retain(held)
    requests = state.last_new = DeferredRows(len(columns), functools.partial(_identified, state, columns))
    return requests


def _identified(state: VllmRunner, columns: list[tuple[Any, ...]]) -> list[ScheduledRequest]:
    """The rows of a step that is not all running requests: each request's client id and prompt hash found once."""
    known = state.known
    requests = []
    for request_id, new, scheduled, done, prompt_len, prompt in columns:
        identity = known.get(request_id)
        if identity is None or new:  # a running request keeps its id and prompt: looked up once
            identity = known[request_id] = (state.client_id(request_id), state.prompts.get(request_id, prompt))
        base, prompt_hash = identity
        requests.append(
            make_scheduled_request((request_id, base, new, scheduled, done, prompt_len, prompt_hash, False))
        )
    return requests


def _running_rows(
    batch: Any, request_ids: list[str], computed: list[int], tokens: dict[str, int], state: VllmRunner
) -> DeferredRows | None:
    """Every row scheduled, none new (decode steps, mostly): the rows as columns, read in C, not row by row. What does
    not change while the batch holds the same requests in the same order comes from the last step."""
    last = state.last_batch
    if last is None or last[0] != request_ids:
        try:
            found_bases, found_hashes = zip(*map(state.known.__getitem__, request_ids), strict=True)
        except KeyError:  # a row this runner never saw new (set up mid-run): row by row
            return None
        prompt_lens = batch.num_prompt_tokens[: len(request_ids)].tolist()
        # a copy: the engine changes its id list in place at later steps
        last = state.last_batch = (list(request_ids), found_bases, prompt_lens, found_hashes)
    ids, bases, prompt_lens, hashes = last
    rows = len(ids)
    counts = [1] * rows if sum(tokens.values()) == rows else list(map(tokens.__getitem__, ids))
    return DeferredRows(rows, functools.partial(rows_of_columns, ids, bases, counts, computed, prompt_lens, hashes))


def not_eager(runner: Any) -> str | None:
    """Why msprobe's hooks would not run in this engine's forward, or None when it is eager."""
    compilation = runner.compilation_config
    mode = getattr(compilation, "mode", None)  # CompilationMode (0.11.1+)
    if mode is None:
        mode = getattr(compilation, "level", None)  # 0.11.0: CompilationLevel int
    graphs = compilation.cudagraph_mode
    reasons = []
    if mode is not None and int(mode) != 0:
        reasons.append(f"compilation mode {getattr(mode, 'name', mode)}")
    if graphs is not None and graphs.name != "NONE":
        reasons.append(f"cudagraph_mode {graphs.name}")
    return ", ".join(reasons) or None
