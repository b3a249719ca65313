#!/usr/bin/env bash
# The whole loop on this CPU: verl's FSDP2 engine and vLLM's engine on the same prompts, dumped by
# msprobe-hooks from the environment alone, then align and compare. `make demo` runs it:
#   bash examples/demo.sh TRAIN_VENV_BIN VLLM_VENV_BIN [OUT_DIR]   (default examples/msprobe_dump)
# The rollout side loads a copy of the weights with one planted fault (demo_inputs.py): the report
# must name that module as the first divergence.
set -euo pipefail
train_bin=$(realpath "$1") vllm_bin=$(realpath "$2")
cd "$(dirname "$0")"
out=$(realpath -m "${3:-msprobe_dump}")
rm -rf "$out" && mkdir -p "$out"
rpc=$(mktemp -d) && trap 'rm -rf "$rpc"' EXIT  # vLLM's IPC sockets, cleaned

echo "== inputs: a tiny random Qwen2, a copy with one planted fault, four prompts"
"$train_bin/python" demo_inputs.py "$out/inputs"

export DUMP_ON=1 PROMPTS_ONLY=1 TORCHDYNAMO_DISABLE=1 MSPROBE_HOOKS_OUTPUT_DIR=$out
echo "== training side: verl's FSDP2 engine recomputes log-probs (one prompt-only dump per sample)"
MSPROBE_ACTOR_CONFIG=$PWD/msprobe_l0.json "$train_bin/msprobe-hooks" run -- \
	"$train_bin/python" cpu_demo.py --model "$out/inputs/model" --prompts "$out/inputs/prompts.jsonl"

echo "== inference side: vLLM's engine (CPU) generates for the same prompts, from the faulty copy"
MSPROBE_GENERATE_CONFIG=$PWD/msprobe_l0.json VLLM_CPU_KVCACHE_SPACE=1 VLLM_RPC_BASE_PATH=$rpc \
	"$vllm_bin/msprobe-hooks" run -- \
	"$vllm_bin/python" vllm_generate.py "$out/inputs/perturbed" "$out/inputs/prompts.jsonl"

echo "== align: pair each training prompt dump with its vLLM prefill dump"
"$train_bin/msprobe-hooks" align "$out/actor" "$out/generate" -o "$out/pairs.jsonl"

echo "== compare: the first module whose error crosses the threshold"
"$train_bin/msprobe-hooks" compare "$out/pairs.jsonl" -o "$out/report"
echo "expected: the planted fault, $("$train_bin/python" -c 'import demo_inputs; print(demo_inputs.PERTURBED_MODULE)')"
