"""The patch catalogue: every built-in patch, as a declarative record.

Each record says what it patches (target module and symbols, through its contract), why, how,
and which upstream change would make it unnecessary, in the manner of vLLM-Ascend's
``patch/__init__.py``. The code of a patch lives in the module named by ``implementation`` and is
imported only when its target is. ``docs/patches.md`` (``python scripts/gen_docs.py``) and ``msprobe-hooks doctor``
are generated from this tuple.
"""

from __future__ import annotations

from ..contracts import Function
from ..registry import Patch

VERL_PREFLIGHT = Patch(
    name="verl.preflight",
    target="verl.utils.device",
    implementation="msprobe_hooks.patches.verl_preflight",
    distribution="verl",
    versions=">=0.7,<0.10",
    why="A consistency run that breaks one pairing constraint (batch sizes, n = DP, eager rollout, prefix "
    "caching, parallel layout, ...) trains and dumps as usual, but its dumps cannot be paired; without a "
    "check that is found out after the cluster time is spent.",
    how="Wraps verl.utils.device.auto_set_device(config), which every verl PPO entry point calls first with "
    "the composed Hydra config, in the driver, before ray.init (main_ppo runs as __main__ under python -m, so "
    "its own functions are out of reach; this one it imports by name). After the call returns, the rules of "
    "msprobe_hooks.preflight run on the config; MSPROBE_HOOKS_PREFLIGHT=error (default) raises with every "
    "finding, warn logs them. Configs without actor_rollout_ref.rollout (SFT, eval) are left alone.",
    retire_when="verl checks a consistency-dump mode itself (a config switch that enforces these settings; "
    "RFC verl#5808 on integrating debugging data collection).",
    contract=(Function("verl.utils.device", "auto_set_device", ("config",)),),
)

PATCHES: tuple[Patch, ...] = (VERL_PREFLIGHT,)
