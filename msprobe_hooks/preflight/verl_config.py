"""A verl run's configuration without running it: from a YAML file, or composed from a launch command.

``msprobe-hooks preflight`` checks the config a job *would* get. For a launch command
(``python3 -m verl.trainer.main_ppo --config-path=... k=v ...``) that means what Hydra would compose:
the entry point's ``@hydra.main(config_path, config_name)`` (read from its source with ``ast``, not
imported), ``--config-path`` / ``--config-name`` as Hydra treats them, and the overrides. The
installed verl's ``trainer/config`` folder is added to the search path, so a user config whose
defaults name ``ppo_trainer`` composes from any working directory.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from msprobe_hooks.contracts import installed_source

_ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
_PYTHON_FLAGS_WITH_ARGUMENT = ("-X", "-W")
_HYDRA_OPTIONS = {
    "--config-path": "config_path",
    "-cp": "config_path",
    "--config-name": "config_name",
    "-cn": "config_name",
}


class ConfigSourceError(ValueError):
    """The file or command cannot be turned into a verl config; the message says why, in one line."""


@dataclass
class LaunchCommand:
    """A parsed launch command: the entry point, Hydra's options, the overrides, leading VAR=value words."""

    entry_file: str
    config_path: str | None = None
    config_name: str | None = None
    overrides: list[str] = field(default_factory=list)
    environ: dict[str, str] = field(default_factory=dict)


def verl_config_dir() -> str | None:
    """The installed verl's ``trainer/config`` folder (verl is not imported)."""
    init = installed_source("verl.trainer.config")
    return os.path.dirname(init) if init else None


def compose(config_dir: str, config_name: str, overrides: Sequence[str] = ()) -> DictConfig:
    """What Hydra gives the entry point: ``config_name`` from ``config_dir`` with ``overrides``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    search = _declared_search_path(os.path.join(config_dir, config_name + ".yaml"))
    verl_dir = verl_config_dir()
    if verl_dir and os.path.realpath(verl_dir) != os.path.realpath(config_dir):
        search.append("file://" + verl_dir)
    extra = [f"hydra.searchpath=[{','.join(repr(entry) for entry in search)}]"] if search else []
    try:
        with initialize_config_dir(config_dir=os.path.abspath(config_dir), version_base=None):
            return hydra_compose(config_name, overrides=[*overrides, *extra])
    except Exception as exc:  # Hydra's errors are many and informative: pass the first line on
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigSourceError(f"cannot compose {config_name!r} from {config_dir}: {first}") from None


def _declared_search_path(primary: str) -> list[str]:
    """The ``hydra.searchpath`` a primary config declares (an override would replace, not extend, it)."""
    if not os.path.isfile(primary):
        return []
    declared = OmegaConf.select(OmegaConf.load(primary), "hydra.searchpath", default=None)
    return [str(entry) for entry in declared or []]


def from_file(path: str) -> DictConfig:
    """A config file: a Hydra primary config (it has a ``defaults`` list) is composed; any other YAML,
    such as a saved ``.hydra/config.yaml``, is the config itself."""
    if not os.path.isfile(path):
        raise ConfigSourceError(f"{path}: no such file; give a verl config YAML or -- and a launch command")
    try:
        loaded = OmegaConf.load(path)
    except Exception as exc:
        raise ConfigSourceError(f"{path}: not a YAML config ({type(exc).__name__}: {exc})") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigSourceError(f"{path}: the top level is a list, not a verl config")
    if "defaults" in loaded:
        folder, name = os.path.split(os.path.abspath(path))
        return compose(folder, os.path.splitext(name)[0])
    return loaded


def parse_command(words: Sequence[str], cwd: str | None = None) -> LaunchCommand:
    """Parse ``[VAR=value ...] [launcher ... --] python [flags] (-m module | script.py) [hydra args]``."""
    words = list(shlex.split(words[0]) if len(words) == 1 else words)
    environ = {}
    while words and _ENV_ASSIGNMENT.fullmatch(words[0]):
        name, _, value = words.pop(0).partition("=")
        environ[name] = value
    start = next((i for i, word in enumerate(words) if os.path.basename(word).startswith("python")), None)
    if start is None:
        raise ConfigSourceError(f"no python interpreter in the command {shlex.join(words)!r}")
    rest = words[start + 1 :]
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        flag = rest.pop(0)
        if flag in _PYTHON_FLAGS_WITH_ARGUMENT and rest:
            rest.pop(0)
    if not rest:
        raise ConfigSourceError("the command names neither -m MODULE nor a script")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise ConfigSourceError("-m without a module name")
        module = rest[1]
        entry = installed_source(module)
        if entry is None:
            raise ConfigSourceError(f"module {module} is not on this interpreter's path; run preflight where verl is")
        rest = rest[2:]
    else:
        entry = os.path.join(cwd or os.getcwd(), rest.pop(0))
        if not os.path.isfile(entry):
            raise ConfigSourceError(f"script {entry} not found")
    command = LaunchCommand(entry_file=os.path.realpath(entry), environ=environ)
    while rest:
        word = rest.pop(0)
        option, eq, value = word.partition("=")
        if option in _HYDRA_OPTIONS:
            if not eq:
                if not rest:
                    raise ConfigSourceError(f"{option} without a value")
                value = rest.pop(0)
            setattr(command, _HYDRA_OPTIONS[option], value)
        elif word.startswith("-"):
            raise ConfigSourceError(f"Hydra option {word} is not supported by preflight (only -cp/-cn and overrides)")
        else:
            command.overrides.append(word)
    return command


def hydra_main_arguments(entry_file: str) -> tuple[str | None, str | None]:
    """``config_path`` and ``config_name`` of the ``@hydra.main`` decorator in ``entry_file``."""
    with open(entry_file, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), filename=entry_file)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "hydra.main":
                values = dict(zip(("config_path", "config_name"), decorator.args, strict=False))
                values.update({kw.arg: kw.value for kw in decorator.keywords if kw.arg})
                found = [values.get(key) for key in ("config_path", "config_name")]
                # a literal string, or None (hydra's default, or a value that is not a literal)
                path, name = (
                    v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else None for v in found
                )
                return path, name
    raise ConfigSourceError(f"{entry_file} has no @hydra.main entry point")


def from_command(words: Sequence[str], cwd: str | None = None) -> tuple[DictConfig, dict[str, str]]:
    """The config a launch command would run with, and the VAR=value words that precede it."""
    command = parse_command(words, cwd)
    config_path, config_name = hydra_main_arguments(command.entry_file)
    config_path = command.config_path or config_path
    config_name = command.config_name or config_name
    if config_path is None or config_name is None:
        raise ConfigSourceError(f"{command.entry_file}: no config_path/config_name (give --config-path/--config-name)")
    if config_path.startswith("pkg://"):
        raise ConfigSourceError(f"--config-path {config_path}: pkg:// paths are not supported; give a folder")
    # Hydra: a relative config path is relative to the file that declares @hydra.main.
    config_dir = os.path.join(os.path.dirname(command.entry_file), config_path)
    return compose(config_dir, config_name, command.overrides), command.environ
