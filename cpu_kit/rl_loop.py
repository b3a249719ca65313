"""A real multi-step RL loop on CPU: vLLM rolls out, verl's FSDP2 engine recomputes and updates, weights go back.

    DUMP_ON=1 PROMPTS_ONLY=1 MSPROBE_ACTOR_CONFIG=... MSPROBE_GENERATE_CONFIG=... \\
        msprobe-hooks run -- .venv/bin/python cpu_kit/rl_loop.py --model DIR --prompts FILE --out DIR \\
        [--iterations 2] [--drop-tensor NAME --at-step K] [--dtype float32] [--lr 1e-4] [--packed]
        [--temperature T --seed S --top-p P] [--train-temperature T] [--logprobs-mode MODE] [--kv-cache-dtype DTYPE]
        [--rollout-hf-overrides JSON] [--rollout-token-change POS]
        [--rollout-engine sglang [--rollout-engine-kwargs JSON]]

One real rollout engine stays up for the whole run: vLLM (:mod:`cpu_kit.vllm_engine`, in ``.venv-vllm``), or
with ``--rollout-engine sglang`` SGLang (:mod:`cpu_kit.sglang_engine`, in ``.venv-sglang``; its own engine
arguments, e.g. its dump switch ``msprobe_dump_config``, as ``--rollout-engine-kwargs``).
Global step g (1, 2, ...) is what verl's trainer does per step, in its order:

1. rollout: the prompts of FILE, one request at a time (each prefill step holds one prompt; with
   ``--packed`` all at once, as vLLM packs them), greedy (with ``--temperature T``: sampled at T,
   request i seeded ``S + i``), with the sampled tokens' log-probs (vLLM's ``--logprobs-mode``);
   request ids (``g{g}-`` before the file's) and uids are new every step;
2. verl's FSDP2 engine (:mod:`cpu_kit.verl_cpu`) recomputes the log-probs with the rollout's in
   the batch (``rollout_log_probs``, as the v1 trainer passes them), ``global_steps = g`` and
   ``temperature`` (``--train-temperature``, 1.0 by default: verl divides the logits by it);
3. a PPO update on that batch (``train_batch``: forward, backward, optimizer step), with the
   recomputed log-probs as ``old_log_probs``;
4. the hand-over, before step g + 1: the engine's full state dict under Hugging Face names (verl's
   own export, ``get_per_tensor_param``, what its rollout sync sends) written to
   ``OUT/handover/step{g+1}/model.safetensors``, then ``update_weights`` on the same running vLLM
   engine (vLLM's in-place reload, see :mod:`cpu_kit.vllm_engine`).

``--drop-tensor NAME --at-step K`` plants a sync fault: NAME is left out of the hand-over before
step K and of every later one (a parameter the sync stopped sending), so from step K on the
rollout runs NAME's stale weights. K >= 2: step 1 runs the checkpoint both engines loaded.

Real causes of a gap, each an option: ``--temperature 0.8 --logprobs-mode processed_logprobs``
with the trainer left at ``--train-temperature 1.0`` (the rollout's log-probs are of logits / 0.8,
training's of the logits: a sampling mismatch); ``--kv-cache-dtype fp8_e4m3`` (the rollout's
attention reads an fp8 KV cache: a precision cause); ``--rollout-hf-overrides JSON``, vLLM's
``hf_overrides`` on the rollout engine only (``{"head_dtype": "bfloat16"}``: its logits in bf16, a
precision cause; ``{"rope_parameters": {...}}``: another model configuration, a configuration cause);
``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` in the environment of an SGLang rollout sampled at ``--temperature T``
with ``--train-temperature T`` (SGLang returns the raw logits' log-probs, verl's recompute divides by T: a
sampling mismatch; SGLang's default, the tempered ones, matches it); ``--rollout-token-change POS``: the
first prompt of the file is fed to the rollout with its token at POS replaced by the next id (modulo the
vocabulary), under its own request id, while training recomputes on the prompt as written (a re-tokenized
prompt: an inputs cause; the other prompts stay as written). The defaults change nothing.

Nothing here dumps: with the hooks on in the environment (the shim on PYTHONPATH, ``DUMP_ON=1``),
the training side dumps the log-prob pass and the vLLM engine, which inherits the environment,
every model step. ``OUT/summary.json`` holds, per step and sample, the rollout's and the training
side's response log-probs (so the token gap can be computed from them), the update's metrics,
wall times, and where the dumps and the engine's log went.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file: cpu_kit is imported from the repository root
    sys.path.insert(0, str(REPO))

from cpu_kit import verl_cpu  # noqa: E402
from cpu_kit.demo_inputs import read_prompts  # noqa: E402
from cpu_kit.engine_server import EngineClient  # noqa: E402
from cpu_kit.sglang_engine import SglangEngine  # noqa: E402
from cpu_kit.vllm_engine import VllmEngine  # noqa: E402

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
SGLANG_PYTHON = REPO / ".venv-sglang" / "bin" / "python"
# What only vLLM's engine takes, with its default: refused with an SGLang rollout rather than left unapplied.
VLLM_ONLY = {"logprobs_mode": "raw_logprobs", "kv_cache_dtype": "auto", "rollout_hf_overrides": {}}
# Adam's first steps move every weight by about lr; the tiny Qwen2's weights are ~0.02 (its init
# std), so 1e-4 moves the norms of the modules' outputs by 2e-3..3e-2 relative per step (measured
# on the demo's model): far above fp32 noise (~1e-7), far below anything that breaks the model.
LEARNING_RATE = 1e-4
# Response lengths cycle through these: verl stacks equal-length fields into dense tensors, which
# its loss does not accept for responses (see verl_cpu.random_samples).
RESPONSE_LENGTHS = (4, 5, 6, 7)
MICRO_BATCH_SIZE = 2  # verl's micro-batches of two must divide the four prompts


def engine_environment(rpc_dir: str) -> dict[str, str]:
    """This process's environment (the hooks' variables included) plus what the CPU engine needs."""
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    env.setdefault("TORCHDYNAMO_DISABLE", "1")  # eager anyway; saves start-up
    env["VLLM_RPC_BASE_PATH"] = rpc_dir  # vLLM's IPC sockets: a private folder, removed after the run
    return env


def hand_over(engine: Any, folder: Path, drop: Sequence[str]) -> list[str]:
    """Write the training engine's full state dict, less ``drop``, as ``folder/model.safetensors``."""
    from safetensors.torch import save_file

    params, _ = engine.get_per_tensor_param()
    state = {name: tensor.detach().contiguous() for name, tensor in params}
    missing = sorted(set(drop) - set(state))
    if missing:
        raise SystemExit(f"--drop-tensor {missing}: not in the training engine's state dict")
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v for k, v in state.items() if k not in drop}, os.fspath(folder / "model.safetensors"))
    return sorted(drop)


def changed_token(prompt: Sequence[int], position: int, vocab_size: int) -> list[int]:
    """``prompt`` with its token at ``position`` replaced by the next id, modulo ``vocab_size``."""
    if not 0 <= position < len(prompt):
        raise SystemExit(f"--rollout-token-change {position}: the first prompt has {len(prompt)} tokens")
    return [(t + 1) % vocab_size if i == position else t for i, t in enumerate(prompt)]


def rollout_samples(prompts: list[dict], outputs: list[dict], step: int) -> list[verl_cpu.Sample]:
    return [
        verl_cpu.Sample(
            prompt=tuple(prompt["prompt_token_ids"]),
            response=tuple(output["token_ids"]),
            uid=f"g{step}-uid{i}",
            request_id=output["id"],
            rollout_log_probs=tuple(output["logprobs"]),
        )
        for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True))
    ]


def global_step(trainer: Any, rollout: EngineClient, prompts: list[dict], step: int, args: argparse.Namespace) -> dict:
    """Hand-over (from step 2), rollout, log-prob pass, update: one global step's record."""
    wall: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        wall[name] = time.perf_counter() - clock
        clock = time.perf_counter()

    handover = None
    if step > 1:
        folder = Path(args.out).resolve() / "handover" / f"step{step}"
        dropped = hand_over(trainer, folder, args.drop_tensor if step >= args.at_step else [])
        rollout.update_weights(folder)
        handover = {"path": os.fspath(folder), "dropped": dropped}
        lap("handover")
    requests = [
        {
            "id": f"g{step}-{prompt['request_id']}",
            "prompt_token_ids": prompt["prompt_token_ids"],
            "max_tokens": RESPONSE_LENGTHS[i % len(RESPONSE_LENGTHS)],
        }
        for i, prompt in enumerate(prompts)
    ]
    if args.rollout_token_change is not None:  # the rollout only: samples keep the prompt as written
        fed = requests[0]["prompt_token_ids"]
        requests[0]["prompt_token_ids"] = changed_token(fed, args.rollout_token_change, vocab_size(args.model))
    if args.temperature is not None:  # sampled, each request seeded: reproducible
        for i, request in enumerate(requests):
            request.update(temperature=args.temperature, seed=args.seed + i, top_p=args.top_p)
    samples = rollout_samples(prompts, rollout.generate(requests, packed=args.packed), step)
    lap("rollout")
    settings = {"micro_batch_size": MICRO_BATCH_SIZE, "global_step": step, "temperature": args.train_temperature}
    batch = verl_cpu.make_batch(samples, **settings)
    training = verl_cpu.response_log_probs(verl_cpu.log_probs(trainer, batch), samples)
    lap("log_prob")
    updated = [replace(s, old_log_probs=tuple(lp.tolist())) for s, lp in zip(samples, training, strict=True)]
    output = verl_cpu.update(trainer, verl_cpu.make_batch(updated, **settings))
    lap("update")
    return {
        "global_step": step,
        "handover": handover,
        "samples": [
            {
                "request_id": s.request_id,
                "uid": s.uid,
                "prompt_token_ids": list(s.prompt),
                "rollout_prompt_token_ids": list(request["prompt_token_ids"]),  # what the rollout was fed
                "response_token_ids": list(s.response),
                "rollout_log_probs": list(s.rollout_log_probs),
                "training_log_probs": lp.tolist(),
            }
            for s, lp, request in zip(samples, training, requests, strict=True)
        ],
        "metrics": {
            "pg_loss": output["metrics"]["actor/pg_loss"].aggregate(),  # a verl Metric
            "grad_norm": float(output["metrics"]["grad_norm"]),
        },
        "wall_s": wall,
    }


def rollout_engine(args: argparse.Namespace, env: dict[str, str], log_path: Path) -> EngineClient:
    """The rollout engine the options ask for, started on the model."""
    if args.rollout_engine == "sglang":
        return SglangEngine(
            args.sglang_python,
            args.model,
            env=env,
            log_path=log_path,
            dtype=args.dtype,
            engine_kwargs=args.rollout_engine_kwargs,
        )
    return VllmEngine(
        args.vllm_python,
        args.model,
        env=env,
        log_path=log_path,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        logprobs_mode=args.logprobs_mode,
        hf_overrides=args.rollout_hf_overrides,
    )


def vocab_size(model: str) -> int:
    return int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])


def dump_locations() -> dict[str, Any] | None:
    """Where the hooks of this run put the dumps (None with DUMP_ON off): the library's own answers."""
    from msprobe_hooks import bootstrap
    from msprobe_hooks.config import read_msprobe_config
    from msprobe_hooks.training.actor_dump import dumper

    cfg = bootstrap.current_config()
    if cfg is None:
        return None
    generate = cfg.generate_config and read_msprobe_config("MSPROBE_GENERATE_CONFIG", cfg.generate_config)
    return {
        "train_log": dumper().log_path,
        "generate_root": (generate or {}).get("dump_path") or cfg.generate_dump_root,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole loop; writes and returns the summary."""
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    prompts = read_prompts(args.prompts)
    verl_cpu.init_process()
    trainer = verl_cpu.make_engine(args.model, micro_batch_size=MICRO_BATCH_SIZE, lr=args.lr)
    rpc_dir = tempfile.mkdtemp(prefix="vllm-rpc")  # short: socket paths must stay under 107 bytes
    began = time.perf_counter()
    try:
        with rollout_engine(args, engine_environment(rpc_dir), out / "engine.log") as rollout:
            engine = {"pid": rollout.pid, "engine": args.rollout_engine, "version": rollout.version}
            engine.update(log=rollout.log_path, start_s=time.perf_counter() - began)
            steps = [global_step(trainer, rollout, prompts, step, args) for step in range(1, args.iterations + 1)]
    finally:
        shutil.rmtree(rpc_dir, ignore_errors=True)
    summary = {
        "model": os.path.abspath(args.model),
        "prompts": os.path.abspath(args.prompts),
        "iterations": args.iterations,
        "rollout_engine": args.rollout_engine,
        "dtype": args.dtype,
        "lr": args.lr,
        "packed": args.packed,
        "temperature": args.temperature,
        "seed": args.seed if args.temperature is not None else None,
        "top_p": args.top_p,
        "train_temperature": args.train_temperature,
        "logprobs_mode": args.logprobs_mode,
        "kv_cache_dtype": args.kv_cache_dtype,
        "rollout_hf_overrides": args.rollout_hf_overrides,
        "rollout_engine_kwargs": args.rollout_engine_kwargs,
        "rollout_token_change": args.rollout_token_change,
        "drop_tensor": args.drop_tensor,
        "at_step": args.at_step if args.drop_tensor else None,
        "engine": engine,
        "dumps": dump_locations(),
        "steps": steps,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def token_gaps(sample: dict) -> list[float]:
    """|training log-prob - rollout log-prob| per response token of one summary sample."""
    return [abs(a - b) for a, b in zip(sample["training_log_probs"], sample["rollout_log_probs"], strict=True)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Qwen2 model folder both engines load (cpu_kit.demo_inputs)")
    parser.add_argument("--prompts", required=True, help="JSON lines of request_id and prompt_token_ids")
    parser.add_argument("--out", required=True, help="folder for summary.json, the hand-overs and the engine log")
    parser.add_argument("--iterations", type=int, default=2, help="global steps to run (default 2)")
    parser.add_argument(
        "--drop-tensor",
        action="append",
        default=[],
        metavar="NAME",
        help="leave NAME out of the hand-over (repeatable)",
    )
    parser.add_argument(
        "--at-step", type=int, default=2, help="the first global step whose hand-over drops them (default 2)"
    )
    parser.add_argument(
        "--rollout-engine", choices=("vllm", "sglang"), default="vllm", help="the engine that rolls out (default vllm)"
    )
    parser.add_argument("--dtype", default="float32", help="the rollout engine's dtype (training stays fp32)")
    parser.add_argument(
        "--lr", type=float, default=LEARNING_RATE, help=f"the actor's learning rate (default {LEARNING_RATE})"
    )
    parser.add_argument("--packed", action="store_true", help="add a step's requests at once (default: one at a time)")
    parser.add_argument("--temperature", type=float, help="sample the rollout at this temperature (default: greedy)")
    parser.add_argument("--seed", type=int, default=0, help="with --temperature: request i's seed is SEED + i")
    parser.add_argument("--top-p", type=float, default=1.0, help="with --temperature: the nucleus kept (default 1.0)")
    parser.add_argument(
        "--train-temperature",
        type=float,
        default=1.0,
        help="the temperature verl's engine divides the logits by (default 1.0)",
    )
    parser.add_argument(
        "--logprobs-mode", default="raw_logprobs", help="vLLM's logprobs_mode (default raw_logprobs, vLLM's own)"
    )
    parser.add_argument(
        "--kv-cache-dtype", default="auto", help="vLLM's kv_cache_dtype, e.g. fp8_e4m3 (default auto: the model's)"
    )
    parser.add_argument(
        "--rollout-hf-overrides",
        type=json.loads,
        default={},
        metavar="JSON",
        help='vLLM\'s hf_overrides on the rollout engine only, e.g. \'{"head_dtype": "bfloat16"}\' (default {})',
    )
    parser.add_argument(
        "--rollout-token-change",
        type=int,
        metavar="POS",
        help="feed the rollout the first prompt with its token at POS replaced by the next id (training: as written)",
    )
    parser.add_argument(
        "--rollout-engine-kwargs",
        type=json.loads,
        default={},
        metavar="JSON",
        help="SGLang's own engine arguments (--rollout-engine sglang), e.g. '{\"msprobe_dump_config\": PATH}'",
    )
    parser.add_argument("--vllm-python", default=os.fspath(VLLM_PYTHON), help="the interpreter of the vLLM venv")
    parser.add_argument("--sglang-python", default=os.fspath(SGLANG_PYTHON), help="the interpreter of the SGLang venv")
    args = parser.parse_args(argv)
    if args.rollout_engine == "sglang":
        given = [f"--{k.replace('_', '-')}" for k, default in VLLM_ONLY.items() if getattr(args, k) != default]
        if given:
            parser.error(f"{', '.join(given)}: vLLM's engine options; --rollout-engine sglang takes none of them")
    elif args.rollout_engine_kwargs:
        parser.error("--rollout-engine-kwargs: SGLang's engine arguments; give --rollout-engine sglang")
    if args.drop_tensor and not 2 <= args.at_step <= args.iterations:
        parser.error(f"--at-step must be within 2..{args.iterations} (step 1 runs the checkpoint both engines loaded)")
    summary = run(args)
    for step in summary["steps"]:
        gap = max(max(token_gaps(sample)) for sample in step["samples"])
        wall = sum(step["wall_s"].values())
        print(f"global step {step['global_step']}: max token gap {gap:.3g}, wall {wall:.1f} s")
    print(f"summary: {Path(args.out).resolve() / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
