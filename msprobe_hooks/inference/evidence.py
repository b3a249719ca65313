"""What an inference process records beside its dispatch log, for a diagnosis of the kind of cause.

* ``{generate dump_path}/{pid}/engine.jsonl``: one line per model load, the engine's numerics settings and model
  configuration (the shape is :func:`msprobe_hooks.numerics.engine_record`, shared with the training side);
* ``{generate dump_path}/{pid}/requests.jsonl``: one line per request, when the engine first schedules it::

    {"request_id": "req-1-1a2b3c4d", "base": "req-1", "time": 1778666400.104512,
     "sampling": {"temperature": 0.8, "top_k": 0, "top_p": 0.95, "min_p": 0.0, "presence_penalty": 0.0,
                  "frequency_penalty": 0.0, "repetition_penalty": 1.0, "logprobs": 0, "seed": null},
     "prompt_len": 6, "prompt_token_ids": [3, 4, 5, 6, 7, 8]}

The engine patches read their engine's objects and hand the values here; reading a setting never raises into
the engine (:func:`read_settings`: a failure gives null and one log line per record).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from msprobe_hooks.join_keys import ENGINE_LOG, REQUESTS_LOG, clock
from msprobe_hooks.jsonl import JsonlLog, current_pid, encode
from msprobe_hooks.numerics import (
    GENERATE_SIDE,
    ROPE_FROM_CONFIG,
    ROPE_FROM_MODULE,
    SAMPLING_KEYS,
    config_fields,
    config_fingerprint,
    dtype_name,
    engine_record,
)


class EvidenceLogs:
    """The two files of one inference process under a generate dump root."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.engine = JsonlLog(root, ENGINE_LOG)
        self.requests = JsonlLog(root, REQUESTS_LOG, deferred=True)  # written in steps: by the writer thread

    def write_engine(self, record: Mapping[str, Any]) -> None:
        self.engine.write(dict(record))

    def write_requests(self, lines: Sequence[str]) -> None:
        """The lines of a step's new requests (:func:`request_line`), in one write."""
        if lines:
            self.requests.write_line("\n".join(lines))

    def write_requests_later(
        self,
        requests: Sequence[tuple[str, Sequence[Any] | None, Iterable[int] | None]],
        at: float,
        client_id: Callable[[str], str],
    ) -> None:
        """A step's new requests, each (the engine's id, :func:`read_sampling`'s values, the prompt's ids), scheduled
        at ``at``: encoded off the step (``client_id`` turns an engine's id into the client's there). The step's
        dispatch line, handed over next, wakes the writer for them."""
        if requests:
            self.requests.write_later(_request_lines, (requests, at, client_id), wake=False)


def _request_lines(
    requests: Sequence[tuple[str, Sequence[Any] | None, Iterable[int] | None]],
    at: float,
    client_id: Callable[[str], str],
) -> str:
    return "\n".join(
        request_line(request_id, client_id(request_id), _sampling_dict(values), ids, at)
        for request_id, values, ids in requests
    )


def write_engine_line(
    logs: EvidenceLogs,
    *,
    engine: str,
    version: str | None,
    rank: int | None,
    settings: Mapping[str, Callable[[], Any]],
    hf_config: Callable[[], Any],
    hf_text_config: Callable[[], Any],
    model: Any,
) -> None:
    """Write one ``engine.jsonl`` line of a loaded model: ``settings`` read into ``numerics``
    (:func:`read_settings`), the configuration dicts ``hf_config`` / ``hf_text_config`` return and the model's rotary
    modules into ``model_config`` (:func:`model_configuration`); one warning naming every setting left null by a
    failure."""
    failures: list[str] = []
    configs = read_settings(
        {"hf_config": hf_config, "hf_text_config": hf_text_config, "rotary modules": lambda: rope_bases(model)},
        failures,
    )
    fields, fingerprint = model_configuration(
        configs["hf_config"], configs["hf_text_config"], configs["rotary modules"]
    )
    logs.write_engine(
        engine_record(
            side=GENERATE_SIDE,
            engine=engine,
            version=version,
            pid=current_pid(),
            rank=rank,
            time=clock(),
            numerics=read_settings(settings, failures),
            model_config=fields,
            fingerprint=fingerprint,
        )
    )
    report_unread(ENGINE_LOG, failures)


def request_line(
    request_id: str | None,
    base: str | None,
    sampling: Mapping[str, Any] | None,
    prompt_token_ids: Iterable[int] | None,
    time: float | None = None,
) -> str:
    """One ``requests.jsonl`` line, encoded: ``prompt_token_ids`` are the ids the engine was fed (None: a prompt
    given otherwise, as embeddings); ``time``: when the engine first scheduled it (None: now)."""
    ids = prompt_token_ids if prompt_token_ids is None or isinstance(prompt_token_ids, list) else list(prompt_token_ids)
    return encode(
        {
            "request_id": request_id,
            "base": base,
            "time": clock() if time is None else time,
            "sampling": None if sampling is None else dict(sampling),
            "prompt_len": None if ids is None else len(ids),
            "prompt_token_ids": ids,
        }
    )


def sampling_values(params: Any, **held_elsewhere: Any) -> dict[str, Any]:
    """A request's :data:`~msprobe_hooks.numerics.SAMPLING_KEYS` read off its sampling parameters object by name (None
    where it has no such attribute, or no object), but for the keys the engine holds elsewhere, given as
    ``held_elsewhere``."""
    values = read_sampling(params) or (None,) * len(SAMPLING_KEYS)
    return {key: held_elsewhere.get(key, value) for key, value in zip(SAMPLING_KEYS, values, strict=True)}


_SAMPLING_ATTRIBUTES = operator.attrgetter(*SAMPLING_KEYS)


def read_sampling(params: Any) -> tuple[Any, ...] | None:
    """A request's :data:`~msprobe_hooks.numerics.SAMPLING_KEYS` values off its sampling parameters object, in that
    order (None where it has no such attribute; None for no object: a pooling request). One C call when the object
    has them all: it runs on the step, once per new request."""
    if params is None:
        return None
    try:
        return _SAMPLING_ATTRIBUTES(params)
    except AttributeError:
        return tuple(getattr(params, key, None) for key in SAMPLING_KEYS)


def _sampling_dict(values: Sequence[Any] | None) -> dict[str, Any] | None:
    return None if values is None else dict(zip(SAMPLING_KEYS, values, strict=True))


def kv_cache_dtype_name(configured: Any, model_dtype: Any) -> str | None:
    """The KV cache's dtype as the engine names it (``"fp8_e4m3"``: the torch storage may be uint8, so its name says
    more); ``"auto"`` (or none) is the model's dtype."""
    return dtype_name(model_dtype) if configured in (None, "auto") else setting_text(configured)


def setting_text(value: Any) -> str | None:
    """A setting that is a str or an Enum of str, as its text."""
    return None if value is None else str(getattr(value, "value", value))


def rope_bases(model: Any) -> list[float]:
    """The distinct bases of the model's rotary modules (vLLM's and SGLang's ``RotaryEmbedding*``: ``base`` and
    ``rotary_dim``), in module order."""
    bases: list[float] = []
    for module in model.modules():
        base = getattr(module, "base", None)
        if not isinstance(base, (int, float)) or isinstance(base, bool) or not hasattr(module, "rotary_dim"):
            continue
        if float(base) not in bases:
            bases.append(float(base))
    return bases


def model_configuration(whole: Any, text: Any, bases: Sequence[float] | None) -> tuple[dict[str, Any], str | None]:
    """The ``model_config`` fields and fingerprint of an engine line: the numerics fields of the effective text
    configuration (``text``, else ``whole``: dicts), the rope theta the rotary modules compute with (``bases``)
    overriding the config's, and the fingerprint of the whole configuration."""
    text = text or whole
    fields = config_fields(text) if isinstance(text, Mapping) else {}
    if bases:  # what the model computes with, whatever the config object says
        fields["rope_theta"] = bases[0] if len(bases) == 1 else list(bases)
        fields["rope_theta_source"] = ROPE_FROM_MODULE
    elif fields.get("rope_theta") is not None:
        fields["rope_theta_source"] = ROPE_FROM_CONFIG
    return fields, config_fingerprint(whole) if isinstance(whole, Mapping) else None


def read_settings(readers: Mapping[str, Callable[[], Any]], failures: list[str]) -> dict[str, Any]:
    """Each reader's value by its key. A setting the engine does not have (``AttributeError``) is None; any other
    failure is None too, and named in ``failures`` (the caller logs them in one line: :func:`report_unread`)."""
    values = {}
    for key, read in readers.items():
        try:
            values[key] = read()
        except AttributeError:
            values[key] = None
        except Exception as exc:  # a setting unread must never stop the engine
            values[key] = None
            failures.append(f"{key} ({type(exc).__name__}: {exc})")
    return values


def report_unread(filename: str, failures: Sequence[str]) -> None:
    """One warning naming every setting a record leaves null because reading it failed."""
    if failures:
        from msprobe_hooks.log import logger

        logger().warning("%s: could not read %s; written as null", filename, ", ".join(failures))
