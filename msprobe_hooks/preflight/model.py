"""What a preflight rule is made of: the run it reads, the values it wants, the findings it reports.

omegaconf is imported where a config is read, not here: it comes with verl, not with msprobe-hooks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from msprobe_hooks.config import Config
from msprobe_hooks.preflight.vocabulary import ACTOR, MEGATRON, MEGATRON_PAIRS

if TYPE_CHECKING:
    from omegaconf import DictConfig


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
class Violation:
    """One value that breaks a rule, and the override (or export) that repairs it."""

    problem: str
    fix: str


@dataclass(frozen=True)
class Layout:
    """What the rules' wanted values depend on: the training strategy, the cards, the actor's Megatron sizes.

    The check reads it from the config (:attr:`CheckedRun.layout`); ``recipe`` makes it from its arguments.
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
class CheckedRun:
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
    check: Callable[[CheckedRun], list[Violation]] | None = None
    applies: Callable[[CheckedRun], bool] = lambda run: True
    strategies: tuple[str, ...] | None = None  # the training strategies it is about (None: every one)
    where_present: bool = False  # keys an older verl lacks have nothing to switch off: check the config's only
    in_recipe: bool = True

    def __post_init__(self) -> None:
        if (self.wanted is None) == (self.check is None):
            raise TypeError(f"rule {self.name}: give it a wanted table or a check, one of the two")

    def about(self, strategy: str) -> bool:
        return self.strategies is None or strategy in self.strategies

    def violations(self, run: CheckedRun) -> list[Violation]:
        """What breaks this rule in ``run`` (empty when it holds)."""
        if self.wanted is None:
            return self.check(run) if self.check else []
        wanted = self.wanted(run.layout)
        if self.where_present:
            wanted = {key: value for key, value in wanted.items() if run.get(key) is not ABSENT}
        return expect_all(run, wanted)


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


def expect(run: CheckedRun, key: str, wanted: object) -> Violation | None:
    """``key`` must be ``wanted``; a missing key is added with ``++``."""
    actual = run.get(key)
    if _same(actual, wanted):
        return None
    prefix = "++" if actual is ABSENT else ""
    return Violation(f"{key} is {_shown(actual)}, needs {hydra_value(wanted)}", f"{prefix}{key}={hydra_value(wanted)}")


def expect_all(run: CheckedRun, wanted: Mapping[str, object]) -> list[Violation]:
    return [violation for key, value in wanted.items() if (violation := expect(run, key, value))]


def fixed(wanted: dict[str, object]) -> Wanted:
    """A table that is the same for every layout."""
    return lambda layout: dict(wanted)
