"""Who writes a rank of a training dump root.

msprobe names its step folders by rank only (``{root}/step{N}/rank{R}``), so two processes that dump one rank under
one root (two jobs sharing ``MSPROBE_HOOKS_OUTPUT_DIR``, two processes that both took rank 0) overwrite each other's
dumps without a word. The first process to dump a rank claims it in ``{root}/rank{R}.writer``; a later one finds the
claim at its first dump and says so once, naming both processes. ``align`` then names and leaves out every folder
both processes' logs list (:mod:`msprobe_hooks.analysis.pairing.candidates`).
"""

from __future__ import annotations

import json
import os
import socket
import time

CLAIM = "rank{rank}.writer"


def claim(root: str, rank: int | None) -> str | None:
    """Claim ``rank`` of ``root`` for this process: None when it is ours (or there is no rank), else the line that
    names the other writer. Only the claim is written; a root that cannot be written is the dump's own failure."""
    if rank is None:
        return None
    path = os.path.join(root, CLAIM.format(rank=rank))
    me = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return _other_writer(path, root, rank, me)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(me) + "\n")
    except OSError:  # a full device: the dump's own write reports it
        pass
    return None


def _other_writer(path: str, root: str, rank: int, me: dict) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            holder = json.loads(handle.read() or "{}")
    except (OSError, ValueError):
        holder = {}
    if not isinstance(holder, dict):
        holder = {}
    if (holder.get("pid"), holder.get("host")) == (me["pid"], me["host"]):
        return None
    since = holder.get("time")
    when = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else ""
    other = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}{when} ({path})"
    return (
        f"the training dump root {root}, rank {rank}, is also written by {other}; this process is pid {me['pid']} on "
        f"{me['host']}: msprobe names its step folders by rank only, so the two overwrite each other's dumps; align "
        "names and leaves out the folders both write (give each job its own MSPROBE_HOOKS_OUTPUT_DIR)"
    )
