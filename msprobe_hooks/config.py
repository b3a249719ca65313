"""Every environment variable msprobe-hooks reads: names, defaults, parsing and validation.

This module is the single owner of the environment contract (docs/env-reference.md). Each
:class:`Variable` record is the one statement of its variable: the :class:`Config` field it
fills, its default, how it is parsed and what it accepts; :func:`load`, the error messages and
``docs/env-reference.md`` (``python scripts/gen_docs.py``) all read the records. Other modules
get values from the :class:`Config` that :func:`load` returns; nothing else reads ``os.environ``
for these names.

Paths are resolved once, in the first process that activates, and written back to the
environment as absolute paths (:func:`pinned_environment`): Ray workers and engine subprocesses
inherit the environment but not the launching shell's working directory.
"""

from __future__ import annotations

import os

from msprobe_hooks.record import Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: activation stays light
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Protocol


PREFIX = "MSPROBE_HOOKS_"
SHIM_PACKAGE = "sitecustomize_shim"  # the folder PYTHONPATH names to activate the hooks (cli.launch.shim_dir)

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")  # blank is off too
BOOL_VALUES = ", ".join(f"{on}/{off}" for on, off in zip(_TRUE, _FALSE[1:], strict=True))

# The values of the choice variables, named for the modules that act on them.
DUMP_PHASES = (LOG_PROB, UPDATE_ACTOR, EVERY_PHASE) = ("log_prob", "update_actor", "all")
PROMPTS_ONLY_MODES = ("off", "forward", "trim")  # named in training/prompts_only.py
GENERATE_FORWARDS = (PREFILL_FORWARDS, EVERY_FORWARD) = ("prefill", "all")
# Which samples' logprob_gap.jsonl lines carry their tokens (MSPROBE_HOOKS_GAP_TOKENS).
GAP_TOKENS = (GAP_TOKENS_DUMPED, GAP_TOKENS_ALL, GAP_TOKENS_NONE) = ("dumped", "all", "none")
PREFLIGHT_MODES = (PREFLIGHT_WARN, PREFLIGHT_ERROR) = ("warn", "error")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
EVERY_PATCH = "*"  # in MSPROBE_HOOKS_DISABLE
DUMP_DIR_ACCEPTED = "a directory path this process can create or write into"

# What msprobe 26.2 accepts (msprobe/core/common/const.py); checked here so that a bad config
# stops the job at start-up instead of at the first dump, an hour in.
TENSOR_TASK = "tensor"  # the task whose dumps hold the values (L2 needs it; the logits check reads values)
MSPROBE_TASKS = ("statistics", TENSOR_TASK, "structure", "diff_check", "acc_check", "nan_check")
MSPROBE_LEVELS = ("L0", "L1", "L2", "mix", "debug")


class ConfigError(ValueError):
    """One or more variables are invalid; ``problems`` holds one self-contained line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _bad(name: str, raw: str, accepted: str, why: str = "") -> str:
    reason = f" ({why})" if why else ""
    return f"{name}={raw!r} is not valid{reason}; accepted: {accepted}"


# --- the kinds of value: each one parses a raw value and says what it accepts ---------------------
# Records (msprobe_hooks.record), not dataclasses or typing.NamedTuple: importing dataclasses (with inspect)
# costs ~5 ms in every process, typing (with re, enum, functools, contextlib) ~4 ms.

if TYPE_CHECKING:

    class Kind(Protocol):
        """What every kind of value does (a protocol for readers and type checkers only)."""

        @property
        def accepted(self) -> str:
            """What the docs and the error messages say is accepted."""

        def parse(self, name: str, raw: str, cwd: str) -> object:
            """The value of ``raw`` (blank: the default, itself blank for some); raise ValueError with one line."""


class Flag(Record):
    """A boolean switch."""

    accepted: str = BOOL_VALUES

    def parse(self, name: str, raw: str, cwd: str) -> bool:
        return parse_bool(name, raw)


class Choice(Record):
    """One of ``values``, in any case; ``aliases`` are other spellings of one of them."""

    values: tuple[str, ...]
    aliases: Mapping[str, str] = {}  # noqa: RUF012  (never mutated)
    upper: bool = False

    @property
    def accepted(self) -> str:
        spellings = "".join(f" ({alias} = {value})" for alias, value in self.aliases.items())
        return ", ".join(self.values) + spellings

    def parse(self, name: str, raw: str, cwd: str) -> str:
        value = raw.strip().upper() if self.upper else raw.strip().lower()
        value = self.aliases.get(value, value)
        if value not in self.values:
            raise ValueError(_bad(name, raw, self.accepted))
        return value


class FlagOr(Record):
    """A switch (``off`` / ``on``) that also takes the words of ``others``, which stand for themselves."""

    off: str
    on: str
    others: tuple[str, ...]

    @property
    def accepted(self) -> str:
        return ", ".join(("0", "1", *self.others)) + " (and true/false, yes/no)"

    def parse(self, name: str, raw: str, cwd: str) -> str:
        value = raw.strip().lower()
        if value in self.others:
            return value
        try:
            return self.on if parse_bool(name, raw) else self.off
        except ValueError:
            raise ValueError(_bad(name, raw, self.accepted)) from None


class MsprobeConfig(Record):
    """The path of an msprobe config.json, made absolute and checked (:func:`read_msprobe_config`)."""

    accepted: str = "path to an msprobe config.json"

    def parse(self, name: str, raw: str, cwd: str) -> str | None:
        if not raw.strip():
            return None
        path = _absolute(raw.strip(), cwd)
        read_msprobe_config(name, path)
        return path


class DumpDir(Record):
    """A directory made absolute, that this process can create or write into (:func:`unwritable`)."""

    accepted: str = DUMP_DIR_ACCEPTED

    def parse(self, name: str, raw: str, cwd: str) -> str:
        raw = raw.strip()
        path = _absolute(raw, cwd)
        why = unwritable(path)
        if why:
            raise ValueError(_bad(name, raw, self.accepted, why))
        return path


class Names(Record):
    """Comma-separated names, as a set (which names exist is checked later: :func:`check_patch_names`)."""

    accepted: str

    def parse(self, name: str, raw: str, cwd: str) -> frozenset[str]:
        return frozenset(_split(raw))


class References(Record):
    """Comma-separated ``module:attribute`` references, in order."""

    accepted: str = "comma-separated module:attribute references to Patch records"

    def parse(self, name: str, raw: str, cwd: str) -> tuple[str, ...]:
        refs = _split(raw)
        for ref in refs:
            module, _, attribute = ref.partition(":")
            if not module or not attribute:
                raise ValueError(_bad(name, raw, self.accepted))
        return refs


class PositiveFloat(Record):
    """A finite number above zero."""

    accepted: str = "a positive number (1e-2, 0.5, ...)"

    def parse(self, name: str, raw: str, cwd: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ValueError(_bad(name, raw, self.accepted)) from None
        if not 0.0 < value < float("inf"):  # nan fails both comparisons
            raise ValueError(_bad(name, raw, self.accepted))
        return value


class RequestIds(Record):
    """Comma-separated request ids, as a set; blank: none (no filter). Their vLLM suffix is stripped where
    they are compared (:func:`msprobe_hooks.join_keys.strip_vllm_suffix`; not imported here: it needs ``re``)."""

    accepted: str = "comma-separated request ids, as the client sent them (no empty item, no space inside an id)"

    def parse(self, name: str, raw: str, cwd: str) -> frozenset[str]:
        if not raw.strip():
            return frozenset()
        ids = [part.strip() for part in raw.split(",")]
        if any(not part or len(part.split()) != 1 for part in ids):
            raise ValueError(_bad(name, raw, self.accepted))
        return frozenset(ids)


class Variable(Record):
    """One environment variable of the contract: what it fills, its default, what it accepts, what it means.

    ``default`` is the raw value an unset (or blank) variable is read as; ``shown_default`` is how
    the docs show it when that says more. ``field`` is the :class:`Config` field the parsed value
    fills ('' for a variable that is not ours). ``suggested`` is what ``msprobe-hooks env`` exports
    when it is unset ('' : nothing).
    """

    name: str
    field: str
    kind: Kind
    default: str
    meaning: str
    shown_default: str = ""
    suggested: str = ""

    @property
    def accepted(self) -> str:
        return self.kind.accepted

    @property
    def default_text(self) -> str:
        return self.shown_default or self.default

    def parse(self, raw: str | None, cwd: str) -> object:
        """The value of ``raw`` (None: unset); ValueError with one line naming the variable."""
        return self.kind.parse(self.name, raw if raw is not None and raw.strip() else self.default, cwd)


VARIABLES: tuple[Variable, ...] = (
    Variable("DUMP_ON", "enabled", Flag(), "0", "Master switch. Off: the shim returns having imported nothing."),
    Variable(
        "DUMP_PHASE",
        "dump_phase",
        Choice(DUMP_PHASES, aliases={"forward_only": LOG_PROB}),
        LOG_PROB,
        "Which actor phase is dumped: the log-prob recomputation, the update (forward and backward), or both.",
        suggested=LOG_PROB,
    ),
    Variable(
        "PROMPTS_ONLY",
        "prompts_only",
        FlagOr(off=PROMPTS_ONLY_MODES[0], on=PROMPTS_ONLY_MODES[1], others=PROMPTS_ONLY_MODES[2:]),
        "0",
        "1: the log-prob dump is an extra prompt-only forward per sample, training maths unchanged. "
        "trim: cut the responses off the batch as the published recipe does (collection runs only).",
        suggested="1",
    ),
    Variable(
        "DUMP_SEQUENCES",
        "dump_sequences",
        Flag(),
        "0",
        "1: in the log-prob pass an extra forward per sample over its whole sequence (prompt + response), "
        "each dumped on its own, the real forward undumped, training maths unchanged: what decode alignment "
        "reads. With PROMPTS_ONLY=1, both (prompt first). Not with PROMPTS_ONLY=trim (no response is left).",
    ),
    Variable(
        "DUMP_REQUEST_IDS",
        "dump_request_ids",
        RequestIds(),
        "",
        "Dump only the samples of these rollout requests (ids as logprob_gap.jsonl and update_actor_log.jsonl "
        "write them; vLLM's -xxxxxxxx suffix is ignored on both sides): other samples' extra forwards run "
        "undumped, a plain micro-batch is dumped only if it holds one of them. The gap log is not filtered.",
        shown_default="empty (every sample)",
    ),
    Variable(
        "MSPROBE_ACTOR_CONFIG",
        "actor_config",
        MsprobeConfig(),
        "",
        "Training-side msprobe config. Its dump_path (default $MSPROBE_HOOKS_OUTPUT_DIR/actor; relative "
        "paths are taken from the config file's folder) is the training dump root, checked as "
        "MSPROBE_HOOKS_OUTPUT_DIR is.",
        shown_default="built-in (statistics, level mix)",
    ),
    Variable(
        "MSPROBE_GENERATE_CONFIG",
        "generate_config",
        MsprobeConfig(),
        "",
        "Inference-side config for engines without a native msprobe switch (SGLang < 0.5.11, GPU vLLM). "
        "Default dump_path: $MSPROBE_HOOKS_OUTPUT_DIR/generate.",
        shown_default="unset",
    ),
    Variable(
        PREFIX + "GENERATE_FORWARDS",
        "generate_forwards",
        Choice(GENERATE_FORWARDS),
        PREFILL_FORWARDS,
        "Which inference forwards the library's own debugger dumps (SGLang < 0.5.11): prefill = those "
        "holding prompt tokens; all = every forward, as SGLang's native switch does. Every forward still "
        "counts as one msprobe step and gets a dispatch-log line.",
    ),
    Variable(
        PREFIX + "ROUTING",
        "routing",
        Flag(),
        "0",
        "Record, in the inference engine, the experts each MoE router chose for every token of every step "
        "(vLLM: the router's capture hook on each MoERunner; SGLang: each TopK module): one routed_experts.jsonl "
        "line per step beside the dispatch log, which compare's routing section reads. Not needed where a dump is "
        "taken (vLLM: MSPROBE_GENERATE_CONFIG; SGLang: its own switch or ours): each dumped step's line is written "
        "then anyway. Dense models: nothing to "
        "record (one line).",
    ),
    Variable(
        PREFIX + "GAP_THRESHOLD",
        "gap_threshold",
        PositiveFloat(),
        "0.1",
        "The log-prob gap, abs(old_log_prob - rollout_log_prob), of one response token above which "
        "logprob_gap.jsonl counts it in `over` (the line's max and mean do not depend on it).",
    ),
    Variable(
        PREFIX + "GAP_TOKENS",
        "gap_tokens",
        Choice(GAP_TOKENS),
        GAP_TOKENS_DUMPED,
        "Which samples' logprob_gap.jsonl lines carry their tokens: token_ids (the sequence the training forward "
        "was fed) and, per response token, log_probs and rollout_log_probs. dumped: the samples of log-prob "
        "passes DUMP_PHASE dumps (those DUMP_REQUEST_IDS names, when set); all: every sample; none: no sample.",
    ),
    Variable(
        PREFIX + "OUTPUT_DIR",
        "output_dir",
        DumpDir(),
        "msprobe_dump",  # checked too: it is pinned, and so checked, in every later process anyway
        "Root of the default dump folders and logs. Checked at start-up on its nearest existing folder "
        "(nothing is created): a read-only mount, /proc or a file in the way stops the process.",
        shown_default="./msprobe_dump, made absolute in the first process",
    ),
    Variable(
        PREFIX + "STRICT",
        "strict",
        Flag(),
        "0",
        "Raise instead of logging and stepping aside when a patch cannot be applied, or when our own work "
        "inside a patched call fails (CI, development).",
    ),
    Variable(
        PREFIX + "DISABLE",
        "disabled",
        Names(f"comma-separated patch names, or {EVERY_PATCH} for all"),
        "",
        "Patches not to apply; names are in docs/patches.md and `msprobe-hooks doctor`.",
        shown_default="empty",
    ),
    Variable(
        PREFIX + "PREFLIGHT",
        "preflight",
        Choice(PREFLIGHT_MODES),
        PREFLIGHT_ERROR,
        "What the consistency preflight does with its findings when verl starts a PPO run: error stops the "
        "run before Ray starts, listing every finding; warn logs them and goes on. To skip the check, "
        "MSPROBE_HOOKS_DISABLE=verl.preflight. See docs/preflight.md.",
    ),
    Variable(
        PREFIX + "LOG_LEVEL",
        "log_level",
        Choice(LOG_LEVELS, upper=True),
        "INFO",
        "Level of the msprobe_hooks logger (stderr).",
    ),
    Variable(
        PREFIX + "EXTRA_PATCHES",
        "extra_patches",
        References(),
        "",
        "Site-specific patches to register besides the built-in ones: each reference names a Patch or "
        "a sequence of Patch records. The module is imported at activation, so keep it light.",
        shown_default="empty",
    ),
    Variable(
        "TORCHDYNAMO_DISABLE",
        "",
        Choice(("1",)),  # what is recommended; not ours, so never parsed (no field)
        "",
        "Not ours, recommended: msprobe hooks do not fire inside TorchDynamo-compiled code. `doctor` checks it.",
        shown_default="unset",
        suggested="1",
    ),
)

VARIABLE = {var.name: var for var in VARIABLES}
KNOWN_NAMES = frozenset(VARIABLE)
# Outside MSPROBE_HOOKS_* (where every unknown name is ours, so reported) a name is reported only
# as a near-miss of one of ours, looked for among the names with these prefixes.
TYPO_PREFIXES = ("DUMP", "PROMPT", "MSPROBE")
NEAR_MISS_DISTANCE = 2  # DUMP_PAHSE, MSPROBE_ACTOR_CONFG, PROMPTS_ONYL: one or two edits away
# Other tools' variables in those prefixes, never typos of ours: msprobe reads MSPROBE_LOG_LEVEL
# (msprobe/core/common/log.py).
FOREIGN_NAMES = frozenset({"MSPROBE_LOG_LEVEL"})


class Config(Record):
    """The validated configuration of this process."""

    enabled: bool
    dump_phase: str
    prompts_only: str
    dump_sequences: bool
    dump_request_ids: frozenset[str]
    actor_config: str | None
    generate_config: str | None
    generate_forwards: str
    routing: bool
    gap_threshold: float
    gap_tokens: str
    output_dir: str
    strict: bool
    disabled: frozenset[str]
    log_level: str
    preflight: str
    extra_patches: tuple[str, ...]
    unknown_names: tuple[str, ...]

    def patch_disabled(self, name: str) -> bool:
        """Whether MSPROBE_HOOKS_DISABLE names patch ``name``, or every patch."""
        return name in self.disabled or EVERY_PATCH in self.disabled

    def phase_selected(self, phase: str) -> bool:
        """Whether an actor pass of ``phase`` ("log_prob" or "update_actor") is to be dumped."""
        return self.dump_phase in (EVERY_PHASE, phase)

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


def _split(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


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
    if level == "L2" and task != TENSOR_TASK:
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
    values: dict[str, object] = {}
    for var in VARIABLES:
        if var.field:
            try:
                values[var.field] = var.parse(env.get(var.name), cwd)
            except ValueError as exc:
                problems.append(str(exc))
    problems += _conflicts(values, env)
    if problems:
        raise ConfigError(problems)
    return Config(**values, unknown_names=tuple(sorted(n for n in env if _reported_unknown(n))))


def _conflicts(values: dict[str, object], env: Mapping[str, str]) -> list[str]:
    """Values that are each valid but contradict each other."""
    if values.get("dump_sequences") and values.get("prompts_only") == PROMPTS_ONLY_MODES[2]:
        why = "PROMPTS_ONLY=trim cuts the responses off the batch: no whole sequence is left to dump"
        return [_bad("DUMP_SEQUENCES", env.get("DUMP_SEQUENCES", ""), "0 with PROMPTS_ONLY=trim", why)]
    return []


def invalid(name: str, raw: str, why: str) -> str:
    """The one-line complaint about variable ``name``, with what its record accepts (for checks made later)."""
    return _bad(name, raw, VARIABLE[name].accepted, why)


def check_patch_names(config: Config, known: list[str]) -> None:
    """Reject names in MSPROBE_HOOKS_DISABLE that no registered patch has."""
    unknown = sorted(config.disabled - set(known) - {EVERY_PATCH})
    if unknown:
        raw = ",".join(sorted(config.disabled))
        raise ConfigError(
            [
                _bad(
                    PREFIX + "DISABLE",
                    raw,
                    f"{EVERY_PATCH} or any of " + ", ".join(known),
                    "unknown " + ", ".join(unknown),
                )
            ]
        )


def pinned_environment(config: Config, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables to write back so that every later process resolves the same absolute paths."""
    env = os.environ if environ is None else environ
    paths = [var for var in VARIABLES if isinstance(var.kind, (DumpDir, MsprobeConfig))]
    pinned = {var.name: getattr(config, var.field) for var in paths}
    return {name: value for name, value in pinned.items() if value is not None and env.get(name) != value}


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
        lines.append(f"| `{var.name}` | {var.default_text} | {var.accepted} | {var.meaning} |")
    return "\n".join(lines)
