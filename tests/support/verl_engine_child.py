"""Drives verl's real FSDP2 or Megatron engine on CPU in a child process and writes what it saw, a JSON file per rank.

Run by the tests as ``python tests/support/verl_engine_child.py '<json spec>'`` (world size 1) or under
``torchrun`` (world size 2), with or without the shim and ``DUMP_ON``. The spec:

* ``model_dir``: where ``cpu_kit.verl_cpu.build_model_dir`` put the tiny Qwen2;
* ``backend``: ``fsdp`` (default, :mod:`cpu_kit.verl_cpu`) or ``megatron`` (:mod:`cpu_kit.megatron_cpu`),
  with ``parallel``: ``make_engine``'s ``tensor_parallel``/``pipeline_parallel``/``virtual_pipeline``;
* ``ops``: a list of ``"actor.log_prob"``, ``"actor.update"``, ``"ref.log_prob"``, ``"critic.values"``;
* ``count``/``seed``/``prompt_lens``/``response_lens``: the global sample set (split over data-parallel ranks);
* ``micro_batch_size``; ``max_token_len`` (use_dynamic_bsz=True with that token budget);
* ``padding_on_rank``: this rank's last sample gets a verl padding uid (``pad…``);
* ``trimmed``: the log-prob passes' batches cut to their prompts by the library's own v1 trim
  (``prompts_only.trim_jagged``, what the trainer runs before old_log_prob in trim mode); updates keep theirs;
* ``capture_logits``: record the logits of every root-module forward of ``actor.log_prob`` (Megatron: ``[b, s, v]``),
  as float, and the dtype the forward gave them in (the op's ``logits_dtype``);
* ``temperature``: the temperature the batches hand the engine (verl's ``temperature`` field; default 1.0);
* ``rollout_log_probs``: every sample carries the rollout's log-probs (near the tiny model's, ``-ln(vocab)``,
  with a seeded spread of ±0.3, so some tokens are over the gap threshold and some under);
* ``request_ids``: the request id of each global sample, instead of ``random_samples``' own;
* ``masked``: ``[[global sample, response token], ...]`` whose ``response_mask`` is 0 (tool tokens);
* ``layout``: ``"v1"`` (the default, ``verl_cpu.make_batch``) or ``"v0"`` (the DataProto path,
  ``support.verl_batches.v0_engine_batch``);
* ``out``: the folder for the report.

Output: ``{out}/rank{R}.json`` holding ``{"rank", "world_size", "results": [one dict per op], "logits",
"fed"}``, ``fed`` being this rank's samples as the first op's batch gave them (``rollout_log_probs``,
``response_mask``) (a file per rank: verl prints to stdout too, and two ranks would interleave). On a
Megatron pipeline stage other than the last, ``log_probs`` and ``values`` are ``[]`` and ``loss`` None:
its engine returns no output there.
"""

from __future__ import annotations

import json
import os
import sys

SPEC = json.loads(sys.argv[1])

# Run as a file: the repository root (cpu_kit) and tests/ (support) go on sys.path.
_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(_TESTS), _TESTS]
from cpu_kit import megatron_cpu, verl_cpu  # noqa: E402

MEGATRON = SPEC.get("backend") == "megatron"
KIT = megatron_cpu if MEGATRON else verl_cpu


def root_module(engine):
    """The module whose forward takes ``input_ids``: the HF model (FSDP), the GPTModel of the rank's first
    model chunk (Megatron)."""
    if not MEGATRON:
        return engine.module
    from verl.utils.megatron_utils import unwrap_model

    return unwrap_model(engine.module[0])


def make_engine(role: str, micro: int):
    parallel = SPEC.get("parallel", {}) if MEGATRON else {}
    return KIT.make_engine(
        SPEC["model_dir"], forward_only=role == "ref", value_head=role == "critic", micro_batch_size=micro, **parallel
    )


def _with_rollout(samples: list, seed: int) -> list:
    """``samples`` with rollout log-probs near the tiny random model's own (about ``-ln(vocab)`` each)."""
    import math
    from dataclasses import replace

    import torch

    gen = torch.Generator().manual_seed(1000 + seed)
    centre = -math.log(verl_cpu.VOCAB_SIZE)
    return [
        replace(s, rollout_log_probs=tuple((centre + 0.6 * torch.rand(len(s.response), generator=gen) - 0.3).tolist()))
        for s in samples
    ]


def _mask_tokens(batch, tokens: list[tuple[int, int]]) -> None:
    """Set ``response_mask`` to 0 at (sample, response token) of ``batch``: jagged (v1) or dense (v0)."""
    mask = batch["response_mask"]
    for sample, token in tokens:
        if mask.is_nested:
            mask.values()[int(mask.offsets()[sample]) + token] = 0
        else:
            mask[sample, token] = 0


def _fed(batch) -> list[dict]:
    """Each sample's rollout log-probs and response mask, as the batch holds them."""
    rollout = batch.get("rollout_log_probs", None)
    return [
        {"rollout_log_probs": None if rollout is None else rollout[i].tolist(), "response_mask": mask.tolist()}
        for i, mask in enumerate(batch["response_mask"].unbind())
    ]


def main() -> None:
    rank, world_size = KIT.init_process()
    samples = verl_cpu.random_samples(
        SPEC.get("count", 4),
        SPEC.get("seed", 0),
        prompt_lens=SPEC.get("prompt_lens", (5, 7, 4, 6)),
        response_lens=SPEC.get("response_lens", (3, 4)),
    )
    if SPEC.get("request_ids"):
        samples = [
            verl_cpu.Sample(s.prompt, s.response, s.uid, s.session_id, request_id)
            for s, request_id in zip(samples, SPEC["request_ids"], strict=True)
        ]
    if SPEC.get("rollout_log_probs"):
        samples = _with_rollout(samples, SPEC.get("seed", 0))
    micro = SPEC.get("micro_batch_size", 2)
    flags = {}
    if "max_token_len" in SPEC:
        flags = {"use_dynamic_bsz": True, "max_token_len_per_gpu": SPEC["max_token_len"]}
    if "temperature" in SPEC:
        flags["temperature"] = SPEC["temperature"]

    engines: dict[str, object] = {}

    def engine(role: str):
        if role not in engines:
            engines[role] = make_engine(role, micro)
        return engines[role]

    def make_batch(mine: list, masked: list, trimmed: bool):
        if SPEC.get("layout", "v1") == "v0":
            from support.verl_batches import v0_engine_batch

            batch = v0_engine_batch(mine, micro_batch_size=micro, **flags)
        else:
            batch = verl_cpu.make_batch(mine, micro_batch_size=micro, **flags)
        if trimmed:
            from msprobe_hooks.training import prompts_only

            batch.update(prompts_only.trim_jagged(batch))
        _mask_tokens(batch, masked)
        return batch

    fed_samples = None
    logits: list[list] = []
    results = []
    for op in SPEC["ops"]:
        role, action = op.split(".")
        eng = engine(role)
        # Tensor-parallel ranks share their samples: the split is over data-parallel ranks.
        dp_rank, dp_size = eng.get_data_parallel_rank(), eng.get_data_parallel_size()
        mine = verl_cpu.shard(samples, dp_rank, dp_size)
        if SPEC.get("padding_on_rank") == rank:
            mine[-1] = verl_cpu.Sample(mine[-1].prompt, mine[-1].response, uid="pad0c0ffee", session_id=0)
        per_rank = len(samples) // dp_size
        masked = [(i - dp_rank * per_rank, j) for i, j in SPEC.get("masked", []) if i // per_rank == dp_rank]
        calls: list[int] = []  # tokens of each root-module forward
        dtypes: list[str] = []  # of the logits of each root-module forward (capture_logits)
        capture = SPEC.get("capture_logits") and op == "actor.log_prob"

        def hook(module, args, kwargs, output, calls=calls, capture=capture, dtypes=dtypes):
            calls.append(int(kwargs["input_ids"].shape[-1]))
            if capture:  # FSDP packs the micro-batch into one row; Megatron's BSHD keeps a row per sample
                value = getattr(output, "logits", output).detach()
                dtypes.append(str(value.dtype).removeprefix("torch."))
                logits.append((value if MEGATRON else value[0]).float().tolist())

        handle = root_module(eng).register_forward_hook(hook, with_kwargs=True)
        batch = make_batch(mine, masked, trimmed=SPEC.get("trimmed") and action == "log_prob")
        if fed_samples is None:
            fed_samples = _fed(make_batch(mine, masked, trimmed=False))
        if action == "log_prob":
            result = {"log_probs": [t.tolist() for t in KIT.log_probs(eng, batch)]}
        elif action == "values":
            with eng.eval_mode():
                output = eng.infer_batch(batch)
            result = {"values": [t.tolist() for t in output["model_output"]["values"].unbind()] if output else []}
        else:
            output = KIT.update(eng, batch)
            # Only the last pipeline stage has outputs; of its tensor-parallel ranks, only the first a grad norm.
            result = {"loss": output.get("loss"), "grad_norm": output.get("metrics", {}).get("grad_norm")}
        handle.remove()
        result.update(op=op, forward_tokens=calls)
        if capture:
            result["logits_dtype"] = dtypes[0] if len(set(dtypes)) == 1 else dtypes
        results.append(result)
    report = {"rank": rank, "world_size": world_size, "results": results, "logits": logits, "fed": fed_samples}
    with open(os.path.join(SPEC["out"], f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    main()
