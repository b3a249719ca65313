#!/usr/bin/env bash
# Two real causes of a log-prob gap, no weight touched, each answered in one line (`make demo-causes`; `make demo`
# stays the planted faults): the CPU kit's RL loop (cpu_kit/rl_loop.py: vLLM rolls out, verl's FSDP2 engine
# recomputes the log-probs) on the demo's model and prompts, one global step, the hooks on from the environment.
# 1. sampling: the rollout samples at temperature 0.8 (seeded) and returns vLLM's processed_logprobs, the
#    log-probs of logits / 0.8, while the trainer is given temperature 1.0: the mismatch RL users hit when the
#    rollout's temperature never reaches the actor's config. Every module agrees; the gap is after the logits.
#    Dumped in tensor mode with whole sequences (DUMP_SEQUENCES=1): each side's log-probs are read from the rollout's
#    own logits at its sampling steps (the rollout's equal log_softmax(logits / 0.8), training's the logits').
# 2. precision: vLLM's KV cache in fp8_e4m3 (kv_cache_dtype; the CPU attention takes it on x86 with AVX-512),
#    everything else as the healthy loop: q/k/v agree, the attention output read from the cache does not.
#   bash examples/demo_causes.sh TRAIN_VENV_BIN VLLM_VENV_BIN [OUT_DIR]   (default examples/msprobe_dump/causes)
set -euo pipefail
DEMO_OUT=msprobe_dump/causes source "$(dirname "$0")/demo_lib.sh"

echo "== inputs: a tiny random Qwen2, four prompts"
PYTHONPATH=.. quietly inputs "$train_bin/python" -m cpu_kit.demo_inputs "$out/inputs"
export DUMP_ON=1 PROMPTS_ONLY=1 TORCHDYNAMO_DISABLE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_RPC_BASE_PATH=$rpc

act() { # one global step of the RL loop with the hooks on, then align + compare: NAME [rl_loop options]
	local name=$1 config=${ACT_CONFIG:-$PWD/msprobe_l0.json}
	shift
	MSPROBE_HOOKS_OUTPUT_DIR=$out/$name/dumps MSPROBE_ACTOR_CONFIG=$config MSPROBE_GENERATE_CONFIG=$config \
		quietly "$name" "$train_bin/msprobe-hooks" run -- "$train_bin/python" ../cpu_kit/rl_loop.py \
		--model "$out/inputs/model" --prompts "$out/inputs/prompts.jsonl" --out "$out/$name/out" \
		--vllm-python "$vllm_bin/python" --iterations 1 "$@"
	grep -h "max token gap" "$out/logs/$name.log"
	"$train_bin/msprobe-hooks" align "$out/$name/dumps/actor" "$out/$name/dumps/generate" \
		-o "$out/$name/pairs.jsonl" >/dev/null
	"$train_bin/msprobe-hooks" compare "$out/$name/pairs.jsonl" -o "$out/$name/report" | sed -n 1p
	"$train_bin/python" -c 'import json, sys; [print("  ", e) for e in json.load(open(sys.argv[1]))["evidence"]
		if "log-probs equal" in e]' "$out/$name/report/diagnosis.json" # what each side'"'"'s log-probs are of, if read
}

echo
echo "#### 1. sampling: the rollout at temperature 0.8 (processed_logprobs), the trainer given 1.0: the rollout's temperature never reached the trainer, the mismatch RL users hit"
ACT_CONFIG=$PWD/msprobe_l0_tensor.json DUMP_SEQUENCES=1 \
	act sampling --temperature 0.8 --seed 0 --logprobs-mode processed_logprobs --train-temperature 1.0
echo "expected: cause: sampling (after the logits), temperature 0.8 (rollout) vs 1.0 (training)"

echo
echo "#### 2. precision: the rollout's KV cache in fp8_e4m3"
act kv_fp8 --kv-cache-dtype fp8_e4m3
echo "expected: cause: precision (prefill), the KV cache fp8_e4m3, at the attention output"

echo
echo "reports: $out/{sampling,kv_fp8}/report/index.html (diagnosis.json); engine logs: $out/logs/"
