"""Consistency preflight: the configuration a training/inference dump pairing depends on.

A consistency run pairs one inference prefill dump with one training micro-batch dump. That only
works when a dozen settings line up (recipe: msprobe's verl consistency guide); a run that violates
one of them still trains and still dumps, but its dumps cannot be paired. The rules here read a
resolved verl config (the OmegaConf ``DictConfig`` that ``main_ppo`` composes with Hydra) and say,
per broken rule, what is wrong, why it breaks the pairing and the exact Hydra override (or export)
that fixes it.

The same rules run in two places: inside the job (patch ``verl.preflight``, once verl has composed
the config, before Ray starts) and on demand (``msprobe-hooks preflight``). ``docs/preflight.md``
lists every rule; a test keeps it in step with :data:`RULES`.

The rooms: :mod:`.vocabulary` (backends, strategies, the config keys), :mod:`.model` (the run a rule
reads, the rule, its findings), :mod:`.rules` (:data:`RULES`), :mod:`.findings` (running them, the
report), :mod:`.recipe` (the overrides that satisfy them), :mod:`.verl_config` (a config from a file
or a launch command). omegaconf is imported where a config is read, not on import: it comes with
verl, not with msprobe-hooks, and the CLI and ``recipe`` use these names in environments without
verl (an inference-only container, an analysis laptop).
"""

from msprobe_hooks.preflight.findings import check, installed, is_ppo_config, report, rollout_backend, rules_table
from msprobe_hooks.preflight.model import ABSENT, CheckedRun, Finding, Layout, Rule, Violation, hydra_value
from msprobe_hooks.preflight.rules import RULES, dump_config_switch
from msprobe_hooks.preflight.vocabulary import (
    GENERATE_CONFIG_PLACEHOLDER,
    ROLLOUT_BACKENDS,
    SKIP_KEYS,
    TORCHDYNAMO_EXPORT,
)

__all__ = [
    "ABSENT",
    "GENERATE_CONFIG_PLACEHOLDER",
    "ROLLOUT_BACKENDS",
    "RULES",
    "SKIP_KEYS",
    "TORCHDYNAMO_EXPORT",
    "CheckedRun",
    "Finding",
    "Layout",
    "Rule",
    "Violation",
    "check",
    "dump_config_switch",
    "hydra_value",
    "installed",
    "is_ppo_config",
    "report",
    "rollout_backend",
    "rules_table",
]
