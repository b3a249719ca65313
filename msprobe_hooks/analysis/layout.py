"""Where the files of a dump tree are: the layout the hooks write, in one place for every reader.

::

    {training root}/{pid}/update_actor_log.jsonl       one per training process (join_keys.TRAINING_LOG)
    {training root}/{pid}/logprob_gap.jsonl            beside it, from the log-prob pass (GAP_LOG)
    {training root}/step{N}/rank{R}/dump.json          msprobe's: the training root is its dump root
    {training root}/rank{R}.writer                     the process that dumps rank R there (training.rank_claim)
    {generate root}/{pid}/dispatch_log.jsonl           one per inference process (DISPATCH_LOG)
    {generate root}/{pid}/routed_experts.jsonl         beside it, MSPROBE_HOOKS_ROUTING=1 (ROUTED_EXPERTS_LOG)
    {generate root}/{pid}/engine.jsonl                 beside it, once per model load: numerics settings (ENGINE_LOG)
    {generate root}/{pid}/requests.jsonl               beside it, once per request: sampling, prompt ids (REQUESTS_LOG)
    {generate root}/{pid}/step{N}/rank{R}/dump.json    msprobe's: the process folder is its dump root

(``proc{pid}`` for ``rank{R}`` when msprobe knew no rank.) The file names are :mod:`msprobe_hooks.join_keys`',
shared with the writers. ``align`` reads the layout here and writes each pair's files into ``pairs.jsonl``
(:mod:`.pairing.pairs`); the later stages take the paths from the pair, and only an older pairs file, without
them, sends ``pairs.read`` back here.
"""

from __future__ import annotations

import os

from msprobe_hooks.join_keys import ENGINE_LOG, GAP_LOG, REQUESTS_LOG, ROUTED_EXPERTS_LOG, rank_folder

DUMP_FILE = "dump.json"


def find_logs(root: str, filename: str) -> list[str]:
    """``{root}/{pid}/{filename}`` for every process folder, sorted."""
    found = []
    for entry in sorted(os.listdir(root)):
        path = os.path.join(root, entry, filename)
        if os.path.isfile(path):
            found.append(path)
    return found


def process_folder(log: str) -> str:
    """The ``{root}/{pid}`` folder of a process's log ``{root}/{pid}/{name}``."""
    return os.path.dirname(log)


def log_root(log: str) -> str:
    """The dump root a process's log ``{root}/{pid}/{name}`` is under."""
    return os.path.dirname(process_folder(log))


def dump_path(root: str, step: int, rank: int | None, pid: int | None) -> str:
    """msprobe's ``{root}/step{N}/rank{R}/dump.json`` (``proc{pid}`` when it knew no rank)."""
    return os.path.join(root, f"step{step}", rank_folder(rank, pid), DUMP_FILE)


def dumps_under(root: str) -> list[str]:
    """Every msprobe ``{root}/step{N}/{rank}/dump.json`` there is, sorted."""
    found = []
    for step in sorted(os.listdir(root)):
        if step.startswith("step") and os.path.isdir(os.path.join(root, step)):
            for leaf in sorted(os.listdir(os.path.join(root, step))):
                path = os.path.join(root, step, leaf, DUMP_FILE)
                if os.path.isfile(path):
                    found.append(path)
    return found


def training_dump(log: str, step: int, rank: int | None, pid: int | None) -> str:
    """The ``dump.json`` of a training log's line: under the training root, beside the process folders."""
    return dump_path(log_root(log), step, rank, pid)


def generate_dump(log: str, step: int, rank: int | None, pid: int | None) -> str:
    """The ``dump.json`` of a dispatch log's line: under that process's folder."""
    return dump_path(process_folder(log), step, rank, pid)


def generate_process(dump: str) -> str:
    """The ``{root}/{pid}`` folder of an inference dump at ``{root}/{pid}/step{N}/rank{R}/dump.json``."""
    return os.path.dirname(os.path.dirname(os.path.dirname(dump)))


def gap_logs(training_root: str) -> list[str]:
    """Every training process's gap log under ``training_root`` (a sample's log-prob pass may run on another
    process than its update's); none when the folder is gone."""
    return find_logs(training_root, GAP_LOG) if os.path.isdir(training_root) else []


def routed_experts_log(process: str) -> str:
    """The routed-experts log of an inference process folder ``{root}/{pid}`` (written or not)."""
    return os.path.join(process, ROUTED_EXPERTS_LOG)


def engine_log(process: str) -> str:
    """The engine-settings log of a process folder ``{root}/{pid}`` (written or not; either side's)."""
    return os.path.join(process, ENGINE_LOG)


def requests_log(process: str) -> str:
    """The per-request log of an inference process folder ``{root}/{pid}`` (written or not)."""
    return os.path.join(process, REQUESTS_LOG)


# A pair's side file (a field of pairs.jsonl's sides) -> where it is in a process folder ``{root}/{pid}``.
PROCESS_FILES = {"routed_experts_log": routed_experts_log, "engine_log": engine_log, "requests_log": requests_log}
