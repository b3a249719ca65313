"""The rollout's returned log-probs against its own logits: what each side's log-probs are of (docs/analysis.md, "The
logits").

msprobe compares no logits under verl (``lm_head`` is skipped on the training side), and a sampling transform acts
after them. Where the rollout's sampling step was dumped in tensor mode, its logits processor's output holds one row
per request of the step (vLLM's ``LogitsProcessor`` output, SGLang's ``next_token_logits``): the logits the engine
sampled the pair's response token from. With that token's two log-probs, the rollout's returned one and training's
recomputed one (``logprob_gap.jsonl`` with ``MSPROBE_HOOKS_GAP_TOKENS``), :func:`check` computes from the same logits
row each transform either side may have applied: ``log_softmax(logits)``, ``log_softmax(logits / T)`` at the rollout's
and at training's temperature, and the rollout's nucleus (temperature, then min-p, top-k, top-p: vLLM's order) with the
kept set renormalised. Which of them each side's values equal is the answer stage's to say (:mod:`..answer.diagnosis`):
here are the numbers only, and why a pair's token could not be checked.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from msprobe_hooks.analysis import dumpfile
from msprobe_hooks.analysis.comparing import names
from msprobe_hooks.analysis.pairing.pairs import Pair
from msprobe_hooks.analysis.results import PairKind
from msprobe_hooks.join_keys import LOGITS_FILE, strip_vllm_suffix
from msprobe_hooks.numerics import TEMPERATURE_SCALED_LOGPROBS

LM_HEAD = "lm_head"  # the name map's module for the logits (vLLM's and SGLang's logits_processor among its names)
# vLLM treats a temperature below this as greedy sampling (its _SAMPLING_EPS): the logits are not divided.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class Transform:
    """A map from logits to log-probs: divided by ``temperature``, then the nucleus (min-p, top-k, top-p) kept and
    renormalised; the identity's name is ``log_softmax(logits)``."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    min_p: float = 0.0

    @classmethod
    def of(cls, sampling: Mapping[str, Any]) -> Transform:
        """From a request's sampling parameters as the engine holds them (-1 / 0 / 1 for a filter off)."""
        t, k, p, m = (sampling.get(name) for name in ("temperature", "top_k", "top_p", "min_p"))
        return cls(
            float(t) if isinstance(t, (int, float)) and t >= GREEDY_BELOW else 1.0,
            k if isinstance(k, int) and k > 0 else None,
            float(p) if isinstance(p, (int, float)) and 0 < p < 1 else 1.0,
            float(m) if isinstance(m, (int, float)) and m > 0 else 0.0,
        )

    @property
    def tempered(self) -> Transform:
        """This transform's temperature alone."""
        return Transform(self.temperature)

    @property
    def name(self) -> str:
        divided = f"logits / {self.temperature:g}" if self.temperature != 1.0 else "logits"
        filters = (("min-p", self.min_p, 0.0), ("top-k", self.top_k, None), ("top-p", self.top_p, 1.0))
        nucleus = [f"{what} {value:g}" for what, value, off in filters if value != off]
        return f"log_softmax({divided})" + (f" over {', '.join(nucleus)}" if nucleus else "")

    def log_prob(self, logits: Any, token: int) -> float:
        """The log-prob of ``token`` under this transform of one row of ``logits`` (float64); -inf when the nucleus
        leaves it out."""
        import torch

        x = logits.double() / self.temperature
        if self.min_p > 0:
            probs = x.softmax(-1)
            x = x.masked_fill(probs < self.min_p * probs.max(), -math.inf)
        if self.top_k is not None and self.top_k < x.numel():
            x = x.masked_fill(x < x.topk(self.top_k).values[-1], -math.inf)
        if self.top_p < 1.0:
            ascending, order = x.sort()
            drop = ascending.softmax(-1).cumsum(-1) <= 1 - self.top_p
            drop[-1] = False  # the most likely token is always kept
            x = x.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), -math.inf)
        return float(x.log_softmax(-1)[token])


# The transforms computed for each token, by what they stand for.
RAW, ROLLOUT_TEMPERATURE, ROLLOUT_SAMPLING, TRAINING_TEMPERATURE = (
    "the raw logits",
    "the rollout's temperature",
    "the rollout's sampling",
    "training's temperature",
)


@dataclass(frozen=True)
class TokenAtLogits:
    """One response token whose rollout logits row was dumped: its two log-probs, and each transform's value of it."""

    key: str
    global_step: Any
    token_index: int
    token: int
    rollout: float  # the log-prob the rollout returned
    training: float  # the log-prob training recomputed
    values: Mapping[str, tuple[str, float]]  # RAW, ...: (the transform's name, its value from the rollout's logits)
    claimed: str | None  # the transform the rollout's mode and sampling parameters say it returns; None: not recorded
    scale: float  # max |logits| / the smallest temperature: how large a rounding error of a log-prob can grow
    dtype: str  # the logits' dtype, as dumped


@dataclass
class LogitsCheck:
    """The tokens checked, and per reason the pairs whose token was not."""

    tokens: list[TokenAtLogits] = field(default_factory=list)
    not_checked: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class Rollout:
    """What the rollout engine recorded that reading its logits needs (engine.jsonl); None: not recorded."""

    logprobs_mode: Any = None
    vocab_size: Any = None  # the model configuration's: a logits row must be that wide (a TP shard is not)
    requests: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # requests.jsonl's lines, by request base


def check(pairs: Sequence[Pair], gaps: Mapping[tuple[str, Any], Mapping[str, Any]], rollout: Rollout) -> LogitsCheck:
    """Each pair's response token against the rollout's logits row it was sampled from (prefill pairs: token 0).

    ``gaps``: the training side's gap lines (:func:`..answer.symptom.read_gaps`)."""
    found = LogitsCheck()
    rows: dict[str, Any] = {}  # the current dump's logits and dtype: its pairs come one after another
    for pair in sorted(pairs, key=lambda p: p.generate.dump):
        token = _token(pair, gaps, rollout, rows)
        if isinstance(token, str):
            found.not_checked[token] += 1
        else:
            found.tokens.append(token)
    return found


def _token(
    pair: Pair,
    gaps: Mapping[tuple[str, Any], Mapping[str, Any]],
    engine: Rollout,
    loaded: dict[str, Any],
) -> TokenAtLogits | str:
    """The pair's :class:`TokenAtLogits`, or why there is none."""
    if pair.kind is PairKind.PREFILL and pair.generate.tokens != pair.prompt_len:
        return "its prefill step held other tokens than the prompt's (chunked, or recomputed after a preemption)"
    index = (pair.token_index or 0) if pair.kind is PairKind.DECODE else 0
    line = gaps.get((strip_vllm_suffix(pair.key), pair.train.global_step))
    values = _per_token(line, index)
    if isinstance(values, str):
        return values
    token, training, rollout, temperature = values
    if pair.generate.dump not in loaded:
        loaded.clear()
        loaded[pair.generate.dump] = _logits_of(pair.generate.dump)
    logits = loaded[pair.generate.dump]
    if isinstance(logits, str):
        return logits
    tensor, dtype = logits
    row = _row(pair, tensor)
    if isinstance(row, str):
        return row
    if engine.vocab_size is None:
        return "the rollout's vocabulary size is not recorded (engine.jsonl): a logits row cannot be told whole"
    if row.numel() != engine.vocab_size:
        return f"the rollout's logits hold {row.numel()} columns, its vocabulary {engine.vocab_size} (a shard?)"
    if not 0 <= token < row.numel():
        return f"token id {token} outside the rollout's vocabulary of {row.numel()}"
    sampling = (engine.requests.get(strip_vllm_suffix(pair.generate.request_id or pair.key)) or {}).get("sampling")
    own = Transform.of(sampling or {})  # the whole of the rollout's sampling transform (identity: not recorded)
    said = claimed(sampling, engine.logprobs_mode) if sampling is not None else None
    trained = Transform.of({"temperature": temperature})
    transforms = {RAW: Transform(), TRAINING_TEMPERATURE: trained}
    if sampling is not None:
        transforms |= {ROLLOUT_TEMPERATURE: own.tempered, ROLLOUT_SAMPLING: own}
    return TokenAtLogits(
        key=pair.key,
        global_step=pair.train.global_step,
        token_index=index,
        token=token,
        rollout=rollout,
        training=training,
        values={role: (t.name, t.log_prob(row, token)) for role, t in transforms.items()},
        claimed=said.name if said is not None else None,
        scale=float(row.abs().max()) / min(t.temperature for t in transforms.values()),
        dtype=dtype,
    )


def claimed(sampling: Mapping[str, Any], mode: Any) -> Transform | None:
    """What a rollout's returned log-probs are of, by its log-probs mode and a request's sampling parameters: vLLM's
    ``processed_logprobs`` the whole transform, SGLang's ``temperature_scaled_logprobs`` the temperature alone, vLLM's
    ``raw_logprobs`` none; None when the mode is not recorded."""
    if mode is None:
        return None
    own = Transform.of(sampling)
    if str(mode).startswith("processed"):
        return own
    return own.tempered if mode == TEMPERATURE_SCALED_LOGPROBS else Transform()


def _per_token(line: Mapping[str, Any] | None, index: int) -> tuple[int, float, float, Any] | str:
    """(token id, training's and the rollout's log-probs, training's temperature) of response token ``index``."""
    if line is None:
        return "no gap line for its sample (logprob_gap.jsonl)"
    prompt = line.get("prompt_len")
    lists = [v for v in (line.get(k) for k in ("token_ids", "log_probs", "rollout_log_probs")) if isinstance(v, list)]
    if len(lists) < 3 or not isinstance(prompt, int):
        return "its gap line holds no per-token log-probs (MSPROBE_HOOKS_GAP_TOKENS)"
    ids, training, rollout = lists
    if not (index < len(training) and index < len(rollout) and prompt + index < len(ids)):
        return "its response token is past the gap line's tokens"
    return int(ids[prompt + index]), float(training[index]), float(rollout[index]), line.get("temperature")


def _logits_of(dump: str) -> tuple[Any, str] | str:
    """The logits tensor of a dumped inference step (the name map's ``lm_head``: a tensor output, or SGLang's
    ``next_token_logits``) and its dtype, or why there is none."""
    if not os.path.isdir(os.path.join(os.path.dirname(dump), dumpfile.TENSOR_FOLDER)):
        return "the rollout's dump is of statistics, no values (a tensor-mode dump of its sampling steps has them)"
    table = names.load()
    try:
        for raw, entry, is_entry in dumpfile.entries(dump):
            name = names.parse(raw) if is_entry and names.kind(raw) is names.EntryKind.MODULE else None
            if name is None or not isinstance(entry, dict) or table.canonical(name)[0] != LM_HEAD:
                continue
            tensor = _logits_tensor(entry.get("output"))
            if tensor is None:
                return "the rollout's logits are not in its dump"
            path = dumpfile.tensor_file(dump, tensor.get("data_name"))
            if path is None:
                return "the rollout's dump holds statistics of its logits, no values (a tensor-mode dump has them)"
            return dumpfile.load_tensor(path), str(tensor.get("dtype", "")).removeprefix("torch.")
        kept = os.path.join(os.path.dirname(dump), LOGITS_FILE)  # the hooks' own, where msprobe left them out
        if os.path.isfile(kept):
            tensor_kept = dumpfile.load_tensor(kept)
            return tensor_kept, str(tensor_kept.dtype).removeprefix("torch.")
    except (OSError, ValueError, RuntimeError) as exc:
        return f"the rollout's logits cannot be read ({exc})"
    return "the rollout's logits are not in its dump"


def _logits_tensor(output: Any) -> Mapping[str, Any] | None:
    first = output[0] if isinstance(output, list) and output else output
    if isinstance(first, dict) and first.get("type") != "torch.Tensor":
        first = first.get("next_token_logits")  # SGLang's LogitsProcessorOutput
    return first if isinstance(first, dict) and first.get("type") == "torch.Tensor" else None


def _row(pair: Pair, tensor: Any) -> Any:
    """The row of ``tensor`` (one per request of the step) the pair's token was sampled from, or why none."""
    side = pair.generate
    if tensor.dim() != 2:
        return f"the rollout's logits have {tensor.dim()} dimensions, not (requests, vocabulary)"
    if side.request_index is not None and tensor.shape[0] == side.num_requests:
        return tensor[side.request_index]
    if tensor.shape[0] == 1 and (side.filtered or side.num_requests == 1):
        return tensor[0]
    if side.request_index is None:
        return "the pairs file does not say the request's place in its step (an older align)"
    return f"the rollout's logits hold {tensor.shape[0]} rows for {side.num_requests} requests"
