"""msprobe-hooks on verl's real FSDP2 training engine, on this CPU, in under a minute.

    DUMP_ON=1 PROMPTS_ONLY=1 msprobe-hooks run -- python examples/cpu_demo.py

A tiny random Qwen2 is built in a temporary folder; verl's engine recomputes the log-probs of
four rollout samples (micro-batches of two) and runs one PPO update on them, exactly as a verl
worker would. Nothing in this script mentions msprobe: the dumps come from the environment.
With PROMPTS_ONLY=1 every sample's prompt gets its own dump (what an inference engine computes
at prefill); DUMP_PHASE=all also dumps the update, backward included.

    python examples/cpu_demo.py --model DIR --prompts PROMPTS_FILE

runs the same engine on a given model folder and on the prompts of ``PROMPTS_FILE`` (one JSON
object a line, ``{"request_id": "...", "prompt_token_ids": [...]}``, the file
``examples/vllm_generate.py`` reads), so a training dump and an inference dump see the same
weights and the same prompts under the same request ids. A line may also carry what the rollout
made of its prompt, as RL hands it to training: ``response_token_ids`` (the generated tokens: the
training side then recomputes prompt + that response) and ``rollout_log_probs`` (their log-probs:
verl's engine then logs the gap to them, ``logprob_gap.jsonl``).

    torchrun --nproc_per_node=2 examples/cpu_demo.py --model DIR --prompts PROMPTS_FILE

runs it at world size 2 (gloo): each rank takes its contiguous share of the prompts, as verl's
data-parallel dispatch does. ``--log-prob-only`` leaves the update out (a large model's optimizer
state need not fit here for a prompt-only dump).

    python examples/cpu_demo.py --engine megatron [--tensor-parallel 2] ...

runs verl's real Megatron engine instead (``cpu_kit.megatron_cpu``: megatron-core and mbridge, from
``make install-megatron``; bf16, as its engine config requires); at tensor parallel 2 under
``python -m torch.distributed.run --nproc_per_node=2``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root: cpu_kit

from cpu_kit import verl_cpu  # noqa: E402
from cpu_kit.demo_inputs import read_prompts  # noqa: E402

ENGINES = ("fsdp", "megatron")


def prompt_samples(path: str) -> list[verl_cpu.Sample]:
    """The prompts of ``path``, each with its rollout's response, else a short one (the log-prob pass needs one)."""
    prompts = read_prompts(path)
    # Unequal response lengths: verl stacks equal-length fields into dense tensors (see random_samples).
    return [
        verl_cpu.Sample(
            prompt=tuple(p["prompt_token_ids"]),
            response=tuple(p.get("response_token_ids") or (3, 4, 5)[: 2 + i % 2]),
            uid=f"uid{i}",
            request_id=p["request_id"],
            rollout_log_probs=tuple(p["rollout_log_probs"]) if p.get("rollout_log_probs") else None,
        )
        for i, p in enumerate(prompts)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description="verl's FSDP2 engine on CPU: log-probs and one update")
    parser.add_argument("--model", help="a Qwen2 model folder (default: a tiny random one, built here)")
    parser.add_argument("--prompts", help="JSON lines of request_id and prompt_token_ids (default: random)")
    parser.add_argument("--engine", choices=ENGINES, default="fsdp", help="verl's training engine (default fsdp)")
    parser.add_argument("--tensor-parallel", type=int, default=1, help="Megatron's tensor parallel size")
    parser.add_argument("--log-prob-only", action="store_true", help="the log-prob pass alone, no update")
    args = parser.parse_args()
    if args.engine == "megatron":
        from cpu_kit import megatron_cpu as kit
    elif args.tensor_parallel != 1:
        parser.error("--tensor-parallel: Megatron only (FSDP shards over the world size)")
    else:
        kit = verl_cpu
    rank, world_size = kit.init_process()
    with tempfile.TemporaryDirectory(prefix="msprobe-hooks-demo-") as folder:
        model = args.model or verl_cpu.build_model_dir(folder)
        parallel = {"tensor_parallel": args.tensor_parallel} if args.engine == "megatron" else {}
        engine = kit.make_engine(model, **parallel)
        samples = prompt_samples(args.prompts) if args.prompts else verl_cpu.random_samples(4, seed=0)
        # Each data-parallel rank takes its share (tensor-parallel ranks share theirs), as verl dispatches.
        samples = verl_cpu.shard(samples, engine.get_data_parallel_rank(), engine.get_data_parallel_size())
        micro = 2 if len(samples) % 2 == 0 else 1  # verl's micro-batches must divide the batch
        log_probs = verl_cpu.log_probs(engine, verl_cpu.make_batch(samples, micro))
        metrics = None if args.log_prob_only else verl_cpu.update(engine, verl_cpu.make_batch(samples, micro))
    where = f"rank {rank} of {world_size}, " if world_size > 1 else ""
    print(f"\n{where}log-prob pass: {len(log_probs)} samples", end="")
    grad_norm = (metrics or {}).get("metrics", {}).get("grad_norm")  # Megatron: the first tensor-parallel rank's
    norm = f", grad_norm {grad_norm:.4g}" if grad_norm is not None else ""
    print(f"; update: loss {metrics.get('loss')}{norm}" if metrics is not None else "")

    from msprobe_hooks import bootstrap
    from msprobe_hooks.training.actor_dump import dumper

    cfg = bootstrap.current_config()
    if cfg is None:
        print("DUMP_ON is off: nothing was dumped. Try:")
        print("  DUMP_ON=1 PROMPTS_ONLY=1 msprobe-hooks run -- python examples/cpu_demo.py")
        return 0
    log_path = dumper().log_path
    if log_path is None:
        print(f"DUMP_ON=1 but no actor micro-batch was due (DUMP_PHASE={cfg.dump_phase})")
        return 1
    with open(log_path, encoding="utf-8") as handle:
        lines = [json.loads(line) for line in handle]
    prompts_only = {"off": "0", "forward": "1", "trim": "trim"}[cfg.prompts_only]
    print(f"DUMP_PHASE={cfg.dump_phase} PROMPTS_ONLY={prompts_only}: {len(lines)} msprobe dumps")
    root = os.path.dirname(os.path.dirname(log_path))
    for line in lines:
        prompts = ", ".join(f"{s['uid']}/{s['session_id']} prompt_len={s['prompt_len']}" for s in line["samples"])
        where = os.path.join(root, f"step{line['step']}", f"rank{line['rank']}", "dump.json")
        print(f"  step{line['step']:<3} {line['phase']:<12} {line['dump']:<11} {prompts}\n         {where}")
    print(f"log: {log_path}")
    if cfg.dump_phase == "log_prob":
        print("(DUMP_PHASE=all dumps the update too, backward included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
