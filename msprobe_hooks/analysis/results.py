"""The vocabulary of the answer: every enum of the analysis layer, the threshold, the result types.

``compare`` builds :class:`ModuleRow` and :class:`PairResult` values; the report writes them. The
fields of :class:`ModuleRow` *are* the columns of ``modules.csv`` (in that order), those of
:class:`PairResult` the columns of ``pairs.csv``, of :class:`SampleRow` ``samples.csv``'s and of
:class:`StepRow` ``steps.csv``'s. Nothing here imports pandas, torch or an engine.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from msprobe_hooks.analysis.table import FLOAT, INT, OBJECT


class _Text(str, enum.Enum):
    """A value written into reports as its text: CSV cells, summary lines and pages read the same."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Status(_Text):
    """What became of one tensor of a pair."""

    COMPARED = "compared"
    UNMATCHED = "unmatched"  # one side only: never a pass
    NOT_COMPARABLE = "not comparable"  # both sides, or one by construction, but no like-for-like numbers (reason)


class Verdict(_Text):
    """The answer for one pair."""

    DIVERGES = "diverges"
    NO_DIVERGENCE = "no divergence above threshold"
    NOTHING_COMPARED = "nothing compared"  # no tensor could be compared: a collection problem, never a pass
    FAILED = "failed"  # a dump could not be read
    STATISTICS = "not comparable (statistics)"  # a token's rows cannot be cut from statistics: never a pass


class FirstRule(_Text):
    """What named a pair's first divergence (``PairResult.first_rule``): the rules of :mod:`.answer.verdict`."""

    STEP = "step"  # StepRule: the error stepped up against the pair's own noise
    THRESHOLD = "threshold"  # FixedRule: the error crossed --threshold
    ROUTING = "routing"  # RoutingRule: a router sent tokens to other experts, at or before any numeric divergence


class Mode(_Text):
    """What a pair compared (``PairResult.mode``); the values are msprobe's ``task`` names of the dumps."""

    TENSOR = "tensor"  # the tensors themselves: cosine, max abs, ||a - b|| / ||b||
    STATISTICS = "statistics"  # their max, min, norm and mean only


class JoinRule(_Text):
    """What joined a training dump to an inference dump."""

    REQUEST_ID = "request_id"  # the engine's suffix stripped, both sides carried it
    PROMPT_HASH = "prompt_hash"  # the hash of the prompt token ids


class PairKind(_Text):
    """What a pair compares."""

    PREFILL = "prefill"  # a prompt's forward against its inference prefill
    DECODE = "decode"  # one response token's row of a training sequence against its inference decode step


class RankRule(_Text):
    """How the generate rank of a pair was chosen."""

    SAME = "same"  # the generate rank equal to the training rank (the recipe's rule; Megatron's only one)
    FSDP_ANY = "fsdp_any"  # FSDP ranks hold whole activations: the lowest generate rank that dumped it
    # FSDP against a tensor-parallel engine: every rank of the engine that ran the prefill (generate.shards),
    # split tensors made whole; generate.rank is its lowest rank
    ALL_RANKS = "all_ranks"


class CausePath(_Text):
    """Where a divergence is: the words of the report's verdict."""

    PREFILL = "prefill path"  # the prompt's forward already differs: every decode token inherits it
    DECODE = "decode path"  # the prompt agrees, response tokens do not
    NEITHER = "neither"  # nothing diverges where pairs were compared


class Cause(_Text):
    """What kind of cause the diagnosis names (answer/diagnosis.py; docs/analysis.md, "What kind of cause")."""

    MODULE = "module"  # a module computes differently on agreeing inputs: its weights or its kernel
    SAMPLING = "sampling"  # a transform after the logits on one side only (temperature, top-k/p)
    INPUTS = "inputs"  # the two sides were fed different token ids
    PRECISION = "precision"  # one side runs a module, or the whole model, in another dtype
    CONFIGURATION = "configuration"  # the engines' model configurations differ in a numerics field
    ROUTING = "routing"  # MoE tokens sent to other experts beyond the rounding at near ties
    NOISE = "noise"  # both sides in one low precision, every error within its floor: no single culprit
    NONE = "none"  # no gap beyond the noise and nothing differs
    UNKNOWN = "unknown"  # a gap beyond the noise that nothing compared explains


class DiagnosisPath(_Text):
    """Where on the way to the log-probs a diagnosis's cause is (None: nowhere in particular)."""

    PREFILL = "prefill"  # the prompt's forward: every response token inherits it
    DECODE = "decode"  # decode tokens only: the prompt's forward agrees
    AFTER_LOGITS = "after the logits"  # the modules agree; what is made of the logits differs


class EntryKind(_Text):
    """What an entry of msprobe's ``dump.json`` is, by its name."""

    MODULE = "module"  # a module's forward (Module.<path>.<Class>.forward.<n>): compared
    API = "api"  # level mix / L1 API rows (Functional., Tensor., Torch., ...): counted, never compared
    BACKWARD = "backward"  # a backward row (DUMP_PHASE=all): not a prefill
    OTHER = "other"


class CompareKind(_Text):
    """How a name-map rule's tensors are compared (its ``compare``: name_map.yaml's header says each)."""

    ONE_TO_ONE = "one_to_one"
    NORM = "norm"
    DECODER_LAYER = "decoder_layer"
    ATTENTION = "attention"
    ATTENTION_BLOCK = "attention_block"
    ACTIVATION = "activation"
    ROUTER = "router"
    TOPK = "topk"
    NORM_LINEAR = "norm_linear"
    NOT_COMPARABLE = "not_comparable"


class Backend(_Text):
    """The training engine ``align`` pairs for: how its ranks meet the inference engine's (``--backend``)."""

    FSDP = "fsdp"  # every rank holds whole activations: any rank of the engine
    MEGATRON = "megatron"  # TP/PP/EP ranks: the same rank only


class Unpaired(_Text):
    """Why ``align`` left a dump unpaired, in the order its table lists them."""

    DECODE_ONLY = "decode only"  # the request (or the step) has no prefill rows
    PAST_RESPONSE = "past the response"  # decode rows after a sequence's last token (SGLang's one extra step)
    NOT_FULL_PREFILL = "not a full prefill"  # chunked, prefix-cached, or not shown to hold the whole prompt
    MULTI_REQUEST = "multi-request step"  # several requests in one dump, not cut to one
    NOT_DUMPED = "not dumped"  # its prefill step was not dumped (msprobe's step filter, GENERATE_FORWARDS)
    NOT_PROMPT_ONLY = "not prompt-only"  # a training dump holding response tokens too (PROMPTS_ONLY off)
    AMBIGUOUS_HASH = "ambiguous hash"  # equal prompts under different ids, or several requests with one prompt
    OTHER_STEP = "another global step"  # its only counterparts ran in another rollout round (the line times say)
    OTHER_RANKS_ONLY = "other ranks only"  # Megatron: no generate dump at the training rank
    REPLICA = (
        "replica"  # another dump of a prefill that was paired (a recomputed prefill; a TP rank's copy not told apart)
    )
    NO_JOIN_KEY = "no join key"  # neither a request id nor a prompt hash
    DUMP_UNREADABLE = "dump unreadable"  # its dump.json is missing or unreadable (named on stderr)
    OVERWRITTEN = "written by two processes"  # two processes' logs name its step folder: one overwrote the other
    NO_COUNTERPART = "no counterpart"  # nothing on the other side carries its key


# Relative error of max/min/norm (tensor mode: ||a-b||/||b||) above which a tensor diverges.
# Measured on real verl FSDP2 / vLLM pairs (docs/analysis.md, "Threshold and verdict"; tests/analysis/test_compare.py
# and test_verdict.py on such pairs): identical weights in fp32 <= 1.3e-6; vLLM in bf16 against fp32 training up to
# 1.2e-2 (max/min), 4.3e-3 (norm); one linear's weights x1.05: 4.8e-2 on that linear's output. 2e-2 sits between
# "the same maths in another precision" and "changed weights"; for fp32 on both sides, --threshold 1e-4 also catches
# sub-percent changes.
DEFAULT_THRESHOLD = 2e-2
# The statistics a verdict is taken on. The mean is reported but not thresholded: on activations
# whose mean is near zero its relative error is large for the same maths (1.8e-4 measured on
# identical fp32 weights, against <= 1.3e-6 for max, min and norm).
THRESHOLDED = ("max", "min", "norm")
# What the threshold is a relative error of, and what the mean is not; the report's and the help's words.
THRESHOLD_OF = "of max, min and norm (tensor mode: ||train - inference|| / ||inference||)"
MEAN_NOT_THRESHOLDED = "the mean is reported, not thresholded (near-zero means)"


def _cell(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


@dataclass(slots=True)  # a report of a thousand pairs holds millions: a third of the memory of a __dict__
class ModuleRow:
    """One tensor of one pair: a row of ``modules.csv`` (its fields are the columns, in order).

    ``order`` is the position in the training model's forward (inference-only tensors after it);
    ``error`` the number the verdict is taken on; None where the status has no such value.
    """

    pair: int | None  # None until the pair's rows are put together (compare sets it)
    order: int
    layer: int | None = None
    module: str | None = None
    io: str | None = None
    status: Status | None = None
    error: float | None = None
    diverges: bool | None = None
    max_rel: float | None = None
    min_rel: float | None = None
    norm_rel: float | None = None
    mean_rel: float | None = None
    cosine: float | None = None
    max_abs: float | None = None
    tensor_rel: float | None = None
    train_name: str | None = None
    generate_name: str | None = None
    train_shape: str | None = None
    generate_shape: str | None = None
    train_dtype: str | None = None
    generate_dtype: str | None = None
    reason: str | None = None
    steps_up: bool | None = None  # the step rule's flag (verdict.StepRule); diverges is the fixed threshold's

    def record(self) -> dict[str, Any]:
        """The row as plain values (enums as their text), keyed by column."""
        return {name: _cell(getattr(self, name)) for name in MODULE_COLUMNS}

    def __reduce__(self) -> tuple[type[ModuleRow], tuple[Any, ...]]:
        # Pickled as its values, in field order: a pool returns millions of rows, and this unpickles in a third
        # of the time the default (its __dict__) takes.
        return ModuleRow, module_row_values(self)


MODULE_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ModuleRow))
# modules.csv's column kinds (table.py's), fixed by the row type so that each pair's lines are written as soon as it
# is compared (row_store.py): what pandas infers for a whole report. pair and order are always set; a layer is missing
# outside the decoder layers, which makes its column a float one (3 written 3.0), as pandas writes it.
MODULE_COLUMN_KINDS: tuple[str, ...] = tuple(
    INT if f.name in ("pair", "order") else FLOAT if f.name == "layer" or f.type == "float | None" else OBJECT
    for f in dataclasses.fields(ModuleRow)
)
# A row's values in column order (enums as they are), in one call: the report reads millions.
module_row_values: Callable[[ModuleRow], tuple[Any, ...]] = operator.attrgetter(*MODULE_COLUMNS)


@dataclass
class PairResult:
    """The verdict of one pair: a row of ``pairs.csv``.

    Comparing fills in what it measured (the counts, ``mode``, ``max_*``: the largest error seen, the routing
    comparison); :func:`.answer.verdict.judge` the verdict by its rules. ``first_*`` describe the pair's first
    divergence and ``first_rule`` the rule that named it: the step rule's (``first_before``: the largest error
    before its step), else the fixed threshold's, unless routing diverges at or before it; ``threshold_*`` the
    fixed threshold's own first row, so that both can be reported when they disagree. ``message`` says why a pair
    FAILED (the column is written only when one did).
    """

    pair: int
    rule: str = ""
    key: str = ""
    train_dump: str = ""
    generate_dump: str = ""
    mode: Mode | None = None
    compared: int | None = None
    unmatched: int | None = None
    not_comparable: int | None = None
    api_rows: str | None = None
    verdict: Verdict = Verdict.NOTHING_COMPARED
    first_module: str = ""
    first_io: str = ""
    first_error: float | None = None
    first_order: int | None = None
    first_layer: int | None = field(default=None, metadata={"column": False})  # its decoder layer; None: outside
    first_train_name: str = ""
    first_generate_name: str = ""
    max_error: float | None = None
    max_module: str = ""
    first_rule: FirstRule | None = None
    first_before: float | None = None
    threshold_module: str = ""
    threshold_io: str = ""
    threshold_error: float | None = None
    kind: PairKind = PairKind.PREFILL
    position: int | None = None
    token_index: int | None = None
    global_step: object = None
    message: str | None = None
    # MoE pairs (analysis/comparing/routing.py): the routers' choices compared per layer; None where nothing was.
    routing_layers: int | None = None  # layers whose choices were compared
    routing_flipped: int | None = None  # (token, layer) pairs whose expert set differs, noise included
    routing_layer: int | None = None  # the first layer where tokens went to other experts beyond the noise
    routing_share: float | None = None  # the share of that layer's tokens whose expert set differs
    numeric_first: str = ""  # with first_rule routing: the first numeric divergence (module io), if any
    routing_noise_layer: int | None = None  # the numeric first divergence's layer, whose router flipped within noise
    routing: list[RoutingLayer] = field(default_factory=list, repr=False, metadata={"column": False})
    # Facts of the compared rows the diagnosis reads (answer/diagnosis.py); None where nothing was compared.
    row_facts: RowFacts | None = field(default=None, repr=False, metadata={"column": False})

    def record(self) -> dict[str, Any]:
        return {name: _cell(getattr(self, name)) for name in PAIR_RESULT_COLUMNS}


PAIR_RESULT_COLUMNS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(PairResult) if f.metadata.get("column", True)
)
# Columns of pairs.csv written only when some pair has a value there: why a pair failed, and the routing
# comparison (MoE pairs only), so that a dense model's report stays what it was.
OPTIONAL_PAIR_COLUMNS: tuple[str, ...] = (
    "message",
    "routing_layers",
    "routing_flipped",
    "routing_layer",
    "routing_share",
    "numeric_first",
    "routing_noise_layer",
)


@dataclass
class RowFacts:
    """What a pair's compared rows say beyond its verdict, as the engines dumped them: facts, never a decision.

    ``dtypes``: (training dtype, inference dtype) -> how many compared floating-point rows carry that pair;
    ``other_dtypes``: "module io" -> its dtypes, for the floating rows whose pair is not the most common one (an
    lm_head in float32 among bfloat16 rows); ``integer_rows``: "module io" -> error, for the compared rows of
    integer tensors on both sides (the token ids fed to the embedding): their statistics are exact, so any error
    above 0 means the values differ.
    """

    dtypes: dict[tuple[str, str], int] = field(default_factory=dict)
    other_dtypes: dict[str, tuple[str, str]] = field(default_factory=dict)
    integer_rows: dict[str, float] = field(default_factory=dict)

    @property
    def common(self) -> tuple[str, str] | None:
        """The (training, inference) dtypes of most compared floating rows (the model's), None without any."""
        return max(self.dtypes, key=lambda pair: (self.dtypes[pair], pair), default=None)


@dataclass
class RoutingLayer:
    """One MoE layer of one pair: which tokens the two sides sent to different experts (a row of ``routing.csv``).

    A token *flips* when its set of top-k experts differs between the sides. A flip is *within noise* when the
    training router's top-k margin at that token (its k-th largest logit minus the next) is no larger than the
    logits' noise (``noise``, relative to the token's largest logit: routing.py says how it is taken): rounding
    alone can reorder such experts, so the flip is reported, never blamed. Comparing fills in the flips and their
    margins; the routing rule (:class:`.answer.verdict.RoutingRule`) the noise and which flips are within it.
    """

    pair: int | None = None
    layer: int | None = None
    status: Status | None = None  # compared, or not comparable (reason)
    tokens: int | None = None
    flipped: int | None = None
    share: float | None = None  # flipped / tokens
    within_noise: int | None = None
    beyond_noise: int | None = None
    top_k: int | None = None
    margin_min: float | None = None  # the smallest training margin among the flipped tokens
    noise: float | None = None
    train_source: str | None = None
    generate_source: str | None = None
    reason: str | None = None
    router: str = field(default="", metadata={"column": False})  # the router's canonical module
    # Per flipped token: the training router's top-k margin and the token's largest |logit|; None without logits.
    margins: list[tuple[float, float]] | None = field(default=None, repr=False, metadata={"column": False})

    def record(self) -> dict[str, Any]:
        return {name: _cell(getattr(self, name)) for name in ROUTING_COLUMNS}


ROUTING_COLUMNS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(RoutingLayer) if f.metadata.get("column", True)
)


@dataclass
class SampleRow:
    """One sample of the symptom -> cause section: a row of ``samples.csv`` (its fields are the columns, in order).

    ``gap_*`` are the fields of its ``logprob_gap.jsonl`` line; ``prefill`` and ``first_decode_divergence`` its
    first divergence in words (module io, "no divergence", "not compared")."""

    request_id: str
    global_step: object = None
    gap_max: object = None
    gap_mean: object = None
    gap_argmax: object = None
    gap_tokens: object = None
    gap_over: object = None
    gap_probs_diff_max: object = None
    gap_probs_diff_mean: object = None
    prefill: str = ""
    decode_compared: int = 0
    decode_diverging: int = 0
    first_decode_token: int | None = None
    first_decode_divergence: str = ""
    path: str = ""  # CausePath's words; empty where nothing of the sample was compared

    def record(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in SAMPLE_COLUMNS}


SAMPLE_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SampleRow))
# The fields of a logprob_gap.jsonl line the samples' rows hold (as gap_<field>).
GAP_FIELDS: tuple[str, ...] = tuple(name.removeprefix("gap_") for name in SAMPLE_COLUMNS if name.startswith("gap_"))


@dataclass
class StepRow:
    """One scalar of one global step (per layer, for the per-layer ones): a row of ``steps.csv``, a long table."""

    global_step: object
    scalar: str
    layer: int | None
    value: float

    def record(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in STEP_COLUMNS}


STEP_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(StepRow))
