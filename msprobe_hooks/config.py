"""Every environment variable msprobe-hooks reads: names, defaults, parsing and validation.

This module is the single owner of the environment contract (DESIGN.md §3). Other modules get
values from the :class:`Config` that :func:`load` returns; nothing else reads ``os.environ``
for these names. ``docs/env-reference.md`` is generated from :data:`VARIABLES`
(``python scripts/gen_docs.py``).

Paths are resolved once, in the first process that activates, and written back to the
environment as absolute paths (:func:`pinned_environment`): Ray workers and engine subprocesses
inherit the environment but not the launching shell's working directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import NamedTuple

PREFIX = "MSPROBE_HOOKS_"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
BOOL_VALUES = "1/0, true/false, yes/no, on/off"

DUMP_PHASES = ("log_prob", "update_actor", "all")
PROMPTS_ONLY_MODES = ("off", "forward", "trim")
GENERATE_FORWARDS = ("prefill", "all")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
PREFLIGHT_MODES = ("warn", "error")
DUMP_DIR_ACCEPTED = "a directory path this process can create or write into"

# What msprobe 26.2 accepts (msprobe/core/common/const.py); checked here so that a bad config
# stops the job at start-up instead of at the first dump, an hour in.
MSPROBE_TASKS = ("statistics", "tensor", "structure", "diff_check", "acc_check", "nan_check")
MSPROBE_LEVELS = ("L0", "L1", "L2", "mix", "debug")


class ConfigError(ValueError):
    """One or more variables are invalid; ``problems`` holds one self-contained line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class Variable(NamedTuple):
    """One environment variable of the contract, as the docs and ``doctor`` show it."""

    name: str
    default: str
    accepted: str
    meaning: str


VARIABLES: tuple[Variable, ...] = (
    Variable("DUMP_ON", "0", BOOL_VALUES, "Master switch. Off: the shim returns having imported nothing."),
    Variable(
        "DUMP_PHASE",
        "log_prob",
        "log_prob, update_actor, all (forward_only = log_prob)",
        "Which actor phase is dumped: the log-prob recomputation, the update (forward and backward), or both.",
    ),
    Variable(
        "PROMPTS_ONLY",
        "0",
        "0, 1, trim (and true/false, yes/no)",
        "1: the log-prob dump is an extra prompt-only forward per sample, training maths unchanged. "
        "trim: cut the responses off the batch as the published recipe does (collection runs only).",
    ),
    Variable(
        "MSPROBE_ACTOR_CONFIG",
        "built-in (statistics, level mix)",
        "path to an msprobe config.json",
        "Training-side msprobe config. Its dump_path (default $MSPROBE_HOOKS_OUTPUT_DIR/actor; relative "
        "paths are taken from the config file's folder) is the training dump root, checked as "
        "MSPROBE_HOOKS_OUTPUT_DIR is.",
    ),
    Variable(
        "MSPROBE_GENERATE_CONFIG",
        "unset",
        "path to an msprobe config.json",
        "Inference-side config for engines without a native msprobe switch (SGLang < 0.5.11, GPU vLLM). "
        "Default dump_path: $MSPROBE_HOOKS_OUTPUT_DIR/generate.",
    ),
    Variable(
        PREFIX + "GENERATE_FORWARDS",
        "prefill",
        ", ".join(GENERATE_FORWARDS),
        "Which inference forwards the library's own debugger dumps (SGLang < 0.5.11): prefill = those "
        "holding prompt tokens; all = every forward, as SGLang's native switch does. Every forward still "
        "counts as one msprobe step and gets a dispatch-log line.",
    ),
    Variable(
        PREFIX + "OUTPUT_DIR",
        "./msprobe_dump, made absolute in the first process",
        DUMP_DIR_ACCEPTED,
        "Root of the default dump folders and logs. Checked at start-up on its nearest existing folder "
        "(nothing is created): a read-only mount, /proc or a file in the way stops the process.",
    ),
    Variable(
        PREFIX + "STRICT",
        "0",
        BOOL_VALUES,
        "Raise instead of logging and stepping aside when a patch cannot be applied, or when our own work "
        "inside a patched call fails (CI, development).",
    ),
    Variable(
        PREFIX + "DISABLE",
        "empty",
        "comma-separated patch names, or * for all",
        "Patches not to apply; names are in docs/patches.md and `msprobe-hooks doctor`.",
    ),
    Variable(
        PREFIX + "PREFLIGHT",
        "error",
        ", ".join(PREFLIGHT_MODES),
        "What the consistency preflight does with its findings when verl starts a PPO run: error stops the "
        "run before Ray starts, listing every finding; warn logs them and goes on. To skip the check, "
        "MSPROBE_HOOKS_DISABLE=verl.preflight. See docs/preflight.md.",
    ),
    Variable(PREFIX + "LOG_LEVEL", "INFO", ", ".join(LOG_LEVELS), "Level of the msprobe_hooks logger (stderr)."),
    Variable(
        PREFIX + "EXTRA_PATCHES",
        "empty",
        "comma-separated module:attribute references",
        "Site-specific patches to register besides the built-in ones: each reference names a Patch or "
        "a sequence of Patch records. The module is imported at activation, so keep it light.",
    ),
    Variable(
        "TORCHDYNAMO_DISABLE",
        "unset",
        "1",
        "Not ours, recommended: msprobe hooks do not fire inside TorchDynamo-compiled code. `doctor` checks it.",
    ),
)

KNOWN_NAMES = frozenset(v.name for v in VARIABLES)
# Outside MSPROBE_HOOKS_* (where every unknown name is ours, so reported) a name is reported only
# as a near-miss of one of ours, looked for among the names with these prefixes.
TYPO_PREFIXES = ("DUMP", "PROMPT", "MSPROBE")
NEAR_MISS_DISTANCE = 2  # DUMP_PAHSE, MSPROBE_ACTOR_CONFG, PROMPTS_ONYL: one or two edits away
# Other tools' variables in those prefixes, never typos of ours: msprobe reads MSPROBE_LOG_LEVEL
# (msprobe/core/common/log.py).
FOREIGN_NAMES = frozenset({"MSPROBE_LOG_LEVEL"})


class Config(NamedTuple):
    """The validated configuration of this process."""

    enabled: bool
    dump_phase: str
    prompts_only: str
    actor_config: str | None
    generate_config: str | None
    generate_forwards: str
    output_dir: str
    strict: bool
    disabled: frozenset[str]
    log_level: str
    preflight: str
    extra_patches: tuple[str, ...]
    unknown_names: tuple[str, ...]

    def phase_selected(self, phase: str) -> bool:
        """Whether an actor pass of ``phase`` ("log_prob" or "update_actor") is to be dumped."""
        return self.dump_phase in ("all", phase)

    @property
    def actor_dump_root(self) -> str:
        """Where training dumps go when the actor config names no dump_path."""
        return os.path.join(self.output_dir, "actor")

    @property
    def generate_dump_root(self) -> str:
        """Where inference dumps go when the generate config names no dump_path."""
        return os.path.join(self.output_dir, "generate")


def parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(_bad(name, raw, BOOL_VALUES))


def is_on(raw: str | None) -> bool:
    """The shim's own reading of DUMP_ON, without validation: anything not clearly off is on."""
    return (raw or "").strip().lower() not in _FALSE


def _bad(name: str, raw: str, accepted: str, why: str = "") -> str:
    reason = f" ({why})" if why else ""
    return f"{name}={raw!r} is not valid{reason}; accepted: {accepted}"


def _parse_phase(raw: str) -> str:
    value = raw.strip().lower() or "log_prob"
    if value == "forward_only":
        return "log_prob"
    if value not in DUMP_PHASES:
        raise ValueError(_bad("DUMP_PHASE", raw, "log_prob, update_actor, all (forward_only = log_prob)"))
    return value


def _parse_prompts_only(raw: str) -> str:
    value = raw.strip().lower()
    if value == "trim":
        return "trim"
    try:
        return "forward" if parse_bool("PROMPTS_ONLY", raw) else "off"
    except ValueError:
        raise ValueError(_bad("PROMPTS_ONLY", raw, "0, 1, trim (and true/false, yes/no)")) from None


def _parse_generate_forwards(raw: str) -> str:
    value = raw.strip().lower() or "prefill"
    if value not in GENERATE_FORWARDS:
        raise ValueError(_bad(PREFIX + "GENERATE_FORWARDS", raw, ", ".join(GENERATE_FORWARDS)))
    return value


def _parse_log_level(raw: str) -> str:
    value = raw.strip().upper() or "INFO"
    if value not in LOG_LEVELS:
        raise ValueError(_bad(PREFIX + "LOG_LEVEL", raw, ", ".join(LOG_LEVELS)))
    return value


def _parse_preflight(raw: str) -> str:
    value = raw.strip().lower() or "error"
    if value not in PREFLIGHT_MODES:
        raise ValueError(_bad(PREFIX + "PREFLIGHT", raw, ", ".join(PREFLIGHT_MODES)))
    return value


def _parse_names(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _parse_extra_patches(raw: str) -> tuple[str, ...]:
    refs = _parse_names(raw)
    for ref in refs:
        module, _, attribute = ref.partition(":")
        if not module or not attribute:
            raise ValueError(_bad(PREFIX + "EXTRA_PATCHES", raw, "comma-separated module:attribute references"))
    return refs


def _absolute(path: str, base: str) -> str:
    return os.path.normpath(os.path.join(base, os.path.expanduser(path)))


def unwritable(path: str) -> str:
    """Why the directory ``path`` cannot be created or written into, or ''.

    Checked on its nearest existing ancestor, creating nothing: the first dump would otherwise
    fail an hour into the job. access() passes root everywhere but on read-only mounts, so a
    filesystem that holds no files at all (proc, sysfs) is refused too.
    """
    ancestor = path
    while not os.path.lexists(ancestor) and os.path.dirname(ancestor) != ancestor:
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        return f"{ancestor} is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{ancestor} is not writable"
    stats = os.statvfs(ancestor)
    if stats.f_blocks == 0 and stats.f_files == 0:
        return f"{ancestor} is on a filesystem that holds no files, as proc and sysfs"
    return ""


def _output_dir(raw: str, cwd: str) -> str:
    path = _absolute(raw, cwd)
    why = unwritable(path)
    if why:
        raise ValueError(_bad(PREFIX + "OUTPUT_DIR", raw, DUMP_DIR_ACCEPTED, why))
    return path


def _check_step_list(value: object) -> bool:
    if not isinstance(value, list):
        return False
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            return False
        if isinstance(item, str):
            low, sep, high = item.partition("-")
            if not (sep and low.isdigit() and high.isdigit()):
                return False
    return True


def read_msprobe_config(name: str, path: str) -> dict:
    """Read and check an msprobe config.json named by variable ``name``; raise ValueError with one line."""
    import json

    if not os.path.isfile(path):
        raise ValueError(_bad(name, path, "path to an existing msprobe config.json", "no such file"))
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(_bad(name, path, "a readable msprobe config.json", str(exc))) from None
    except json.JSONDecodeError as exc:
        raise ValueError(_bad(name, path, "an msprobe config.json", f"not valid JSON: {exc}")) from None
    if not isinstance(data, dict):
        raise ValueError(_bad(name, path, "a JSON object with msprobe keys", "top level is not an object"))
    task = data.get("task", "statistics")
    if task not in MSPROBE_TASKS:
        raise ValueError(_bad(name, path, "task one of " + ", ".join(MSPROBE_TASKS), f"task={task!r}"))
    level = data.get("level", "L1")
    if level not in MSPROBE_LEVELS:
        raise ValueError(_bad(name, path, "level one of " + ", ".join(MSPROBE_LEVELS), f"level={level!r}"))
    if level == "L2" and task != "tensor":
        raise ValueError(_bad(name, path, "level L2 with task tensor", "msprobe requires task tensor at L2"))
    for key in ("step", "rank"):
        if key in data and not _check_step_list(data[key]):
            raise ValueError(_bad(name, path, f'{key} a list of ints or "a-b" strings', f"{key}={data[key]!r}"))
    dump_path = data.get("dump_path")
    if dump_path is not None and (not isinstance(dump_path, str) or not dump_path.strip()):
        raise ValueError(_bad(name, path, "dump_path a non-empty string", f"dump_path={dump_path!r}"))
    if dump_path:
        # One folder for every process of the job, whatever each one's working directory.
        data["dump_path"] = _absolute(dump_path, os.path.dirname(path))
        why = unwritable(data["dump_path"])
        if why:
            raise ValueError(_bad(name, path, f"dump_path {DUMP_DIR_ACCEPTED}", f"dump_path={dump_path!r}: {why}"))
    return data


def load(environ: Mapping[str, str] | None = None) -> Config:
    """Parse and validate every variable; raise :class:`ConfigError` listing all problems at once."""
    env = os.environ if environ is None else environ
    cwd = os.getcwd()
    problems: list[str] = []

    def parse(name: str, parser: Callable[[str], object], default: object) -> object:
        raw = env.get(name)
        if raw is None:
            return default
        try:
            return parser(raw)
        except ValueError as exc:
            problems.append(str(exc))
            return default

    def config_path(name: str) -> str | None:
        raw = env.get(name, "").strip()
        if not raw:
            return None
        path = _absolute(raw, cwd)
        try:
            read_msprobe_config(name, path)
        except ValueError as exc:
            problems.append(str(exc))
        return path

    enabled = parse("DUMP_ON", lambda raw: parse_bool("DUMP_ON", raw), False)
    output_raw = env.get(PREFIX + "OUTPUT_DIR", "").strip() or "msprobe_dump"
    try:  # the default is checked too: it is pinned, and so checked, in every later process anyway
        output_dir = _output_dir(output_raw, cwd)
    except ValueError as exc:
        problems.append(str(exc))
        output_dir = _absolute(output_raw, cwd)
    config = Config(
        enabled=bool(enabled),
        dump_phase=str(parse("DUMP_PHASE", _parse_phase, "log_prob")),
        prompts_only=str(parse("PROMPTS_ONLY", _parse_prompts_only, "off")),
        actor_config=config_path("MSPROBE_ACTOR_CONFIG"),
        generate_config=config_path("MSPROBE_GENERATE_CONFIG"),
        generate_forwards=str(parse(PREFIX + "GENERATE_FORWARDS", _parse_generate_forwards, "prefill")),
        output_dir=output_dir,
        strict=bool(parse(PREFIX + "STRICT", lambda raw: parse_bool(PREFIX + "STRICT", raw), False)),
        disabled=frozenset(parse(PREFIX + "DISABLE", _parse_names, ())),  # type: ignore[arg-type]
        log_level=str(parse(PREFIX + "LOG_LEVEL", _parse_log_level, "INFO")),
        preflight=str(parse(PREFIX + "PREFLIGHT", _parse_preflight, "error")),
        extra_patches=parse(PREFIX + "EXTRA_PATCHES", _parse_extra_patches, ()),  # type: ignore[arg-type]
        unknown_names=tuple(sorted(n for n in env if _reported_unknown(n))),
    )
    if problems:
        raise ConfigError(problems)
    return config


def check_patch_names(config: Config, known: list[str]) -> None:
    """Reject names in MSPROBE_HOOKS_DISABLE that no registered patch has."""
    unknown = sorted(config.disabled - set(known) - {"*"})
    if unknown:
        raw = ",".join(sorted(config.disabled))
        raise ConfigError(
            [_bad(PREFIX + "DISABLE", raw, "* or any of " + ", ".join(known), "unknown " + ", ".join(unknown))]
        )


def pinned_environment(config: Config, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables to write back so that every later process resolves the same absolute paths."""
    env = os.environ if environ is None else environ
    pinned = {PREFIX + "OUTPUT_DIR": config.output_dir}
    for name, value in (
        ("MSPROBE_ACTOR_CONFIG", config.actor_config),
        ("MSPROBE_GENERATE_CONFIG", config.generate_config),
    ):
        if value is not None:
            pinned[name] = value
    return {name: value for name, value in pinned.items() if env.get(name) != value}


def _edit_distance(a: str, b: str) -> int:
    """Edits (insert, delete, substitute, swap two neighbours) that turn ``a`` into ``b``."""
    before: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            cost = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cost = min(cost, before[j - 2] + 1)
            current.append(cost)
        before, previous = previous, current
    return previous[-1]


def _near_miss(name: str) -> str:
    """The name of ours that ``name`` is a typo of (at most NEAR_MISS_DISTANCE edits away), or ''."""
    distances = [(_edit_distance(name, known), known) for known in sorted(KNOWN_NAMES)]
    distance, known = min(distances)
    return known if distance <= NEAR_MISS_DISTANCE else ""


def _reported_unknown(name: str) -> bool:
    if name in KNOWN_NAMES or name in FOREIGN_NAMES:
        return False
    return name.startswith(PREFIX) or (name.startswith(TYPO_PREFIXES) and bool(_near_miss(name)))


def suggest(name: str) -> str:
    """The known name an unknown variable is probably a typo of, or ''."""
    import difflib

    matches = difflib.get_close_matches(name, sorted(KNOWN_NAMES), n=1)
    return _near_miss(name) or (matches[0] if matches else "")


def reference_table() -> str:
    """The Markdown table of every variable, for docs/env-reference.md."""
    lines = ["| variable | default | accepted | meaning |", "|---|---|---|---|"]
    for var in VARIABLES:
        lines.append(f"| `{var.name}` | {var.default} | {var.accepted} | {var.meaning} |")
    return "\n".join(lines)
