#!/usr/bin/env bash
# The whole loop on this CPU: verl's FSDP2 engine and vLLM's engine on the same prompts, dumped by
# msprobe-hooks from the environment alone, then align and compare, twice: vLLM on the very same
# checkpoint (the report must find no divergence), then on a copy with one planted fault
# (cpu_kit/demo_inputs.py; the report must name that module). `make demo` runs it:
#   bash examples/demo.sh TRAIN_VENV_BIN VLLM_VENV_BIN [OUT_DIR]   (default examples/msprobe_dump)
# The engines' own output goes to OUT_DIR/logs/, the terminal gets the summary.
set -euo pipefail
train_bin=$(realpath "$1")
vllm_bin=$(realpath "$2")
cd "$(dirname "$0")"
out=$(realpath -m "${3:-msprobe_dump}")
rm -rf "$out" && mkdir -p "$out/logs"
rpc=$(mktemp -d) && trap 'rm -rf "$rpc"' EXIT  # vLLM's IPC sockets, cleaned

quietly() {  # run a step with its output in a log file; on failure show the end of it
	local log=$out/logs/$1.log
	shift
	"$@" >"$log" 2>&1 || { tail -n 40 "$log"; echo "failed: see $log" >&2; return 1; }
}

echo "== inputs: a tiny random Qwen2, a copy with one planted fault, four prompts"
PYTHONPATH=.. "$train_bin/python" -m cpu_kit.demo_inputs "$out/inputs"
prompts=$out/inputs/prompts.jsonl

export DUMP_ON=1 PROMPTS_ONLY=1 TORCHDYNAMO_DISABLE=1
echo "== training side: verl's FSDP2 engine recomputes log-probs (one prompt-only dump per sample)"
MSPROBE_HOOKS_OUTPUT_DIR=$out/train MSPROBE_ACTOR_CONFIG=$PWD/msprobe_l0.json quietly train \
	"$train_bin/msprobe-hooks" run -- "$train_bin/python" cpu_demo.py --model "$out/inputs/model" --prompts "$prompts"
echo "   $(grep -c . "$out"/train/actor/*/update_actor_log.jsonl) dumps under $out/train/actor"

for checkpoint in model perturbed; do
	echo
	echo "== inference side: vLLM's engine (CPU) generates for the same prompts from inputs/$checkpoint"
	run=$out/$checkpoint
	MSPROBE_HOOKS_OUTPUT_DIR=$run MSPROBE_GENERATE_CONFIG=$PWD/msprobe_l0.json VLLM_CPU_KVCACHE_SPACE=1 \
		VLLM_RPC_BASE_PATH=$rpc quietly "vllm-$checkpoint" \
		"$vllm_bin/msprobe-hooks" run -- "$vllm_bin/python" vllm_generate.py "$out/inputs/$checkpoint" "$prompts"
	echo "== align + compare"
	"$train_bin/msprobe-hooks" align "$out/train/actor" "$run/generate" -o "$run/pairs.jsonl"
	"$train_bin/msprobe-hooks" compare "$run/pairs.jsonl" -o "$run/report"
done
echo
echo "expected: no divergence on inputs/model; the planted fault, $(PYTHONPATH=.. "$train_bin/python" -c \
	'from cpu_kit import demo_inputs as d; print(d.PERTURBED_MODULE, "x", d.PERTURBATION)'), on inputs/perturbed"
echo "engine logs: $out/logs/"
