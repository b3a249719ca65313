"""SGLang ``ForwardBatch.init_new``: carry who is in the batch to ``ModelRunner.forward``.

``ModelRunner.forward`` sees only the ForwardBatch, which never holds prompts and holds request
ids only from 0.5.10 on. ``init_new`` is the one place, on every version, where the requests are
in reach: its ``batch`` is a ModelWorkerBatch with ``reqs`` (0.5.6-0.5.12), a ScheduleBatch
(0.5.13+), or on 0.5.2-0.5.5 a ModelWorkerBatch that the ``sglang.schedule_batch`` patch has
tagged with the requests in the scheduler thread. The request identities are put on the returned
ForwardBatch as one attribute that only the ``sglang.model_runner`` patch reads, and beside them the
``requests.jsonl`` lines of the requests the batch holds for the first time, made from their ``Req``
(:mod:`.evidence`), for the runner to write.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import Any, NamedTuple

from msprobe_hooks import join_keys, patching
from msprobe_hooks.patches.sglang.evidence import request_line_of

# On ForwardBatch (all versions) and on ModelWorkerBatch (0.5.2-0.5.5): tuple[RequestIdentity, ...].
REQUESTS_ATTR = "_msprobe_hooks_requests"
# Beside it: list[str], the requests.jsonl lines of the requests this batch holds for the first time (absent: none).
NEW_REQUESTS_ATTR = "_msprobe_hooks_new_requests"
# On Req: its RequestIdentity in every batch after its first, made once; its presence marks the request as seen.
_IDENTITY_ATTR = "_msprobe_hooks_identity"


class RequestIdentity(NamedTuple):
    """One request of a batch, as the dispatch log needs it."""

    request_id: str
    prompt_len: int
    prompt_hash: str
    new: bool  # the first batch this request is in, in this process


def identities(reqs: Iterable[Any], new_lines: list[str] | None = None) -> tuple[RequestIdentity, ...]:
    """Identities of SGLang ``Req`` objects, in batch order; the ``requests.jsonl`` line of each request first seen
    here appended to ``new_lines`` when given.

    The identity (prompt hash included) is made once per request and kept on the request, so a
    decode step of long prompts costs one attribute lookup per request, not a hash.
    """
    found = []
    for req in reqs:
        seen = getattr(req, _IDENTITY_ATTR, None)
        if seen is None:
            ids = req.origin_input_ids
            seen = RequestIdentity(str(req.rid), len(ids), join_keys.prompt_hash(ids), new=False)
            setattr(req, _IDENTITY_ATTR, seen)
            found.append(seen._replace(new=True))
            if new_lines is not None:
                new_lines.append(request_line_of(req))
        else:
            found.append(seen)
    return tuple(found)


def carry(target: Any, reqs: Iterable[Any]) -> None:
    """Put the identities of ``reqs`` and the request lines of those first seen (if any) on ``target``."""
    new_lines: list[str] = []
    setattr(target, REQUESTS_ATTR, identities(reqs, new_lines))
    if new_lines:
        setattr(target, NEW_REQUESTS_ATTR, new_lines)


def _carry_requests(forward_batch: Any, args: tuple, kwargs: dict) -> None:
    """The requests of ``init_new``'s batch, onto the ForwardBatch it made."""
    batch = patching.argument(args, kwargs, "batch", 0)
    requests = getattr(batch, REQUESTS_ATTR, None)
    if requests is not None:  # 0.5.2-0.5.5: tagged in the scheduler thread, with the new requests' lines
        setattr(forward_batch, REQUESTS_ATTR, requests)
        lines = getattr(batch, NEW_REQUESTS_ATTR, None)
        if lines is not None:
            setattr(forward_batch, NEW_REQUESTS_ATTR, lines)
    elif getattr(batch, "reqs", None) is not None:
        carry(forward_batch, batch.reqs)


def patch(module: ModuleType, ctx: patching.PatchContext) -> None:
    def init_new(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        forward_batch = wrapped(*args, **kwargs)
        ctx.guarded("reading the batch's requests", _carry_requests, forward_batch, args, kwargs)
        return forward_batch

    ctx.wrap(module.ForwardBatch, "init_new", init_new)
