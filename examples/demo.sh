#!/usr/bin/env bash
# The whole story on this CPU, dumped by msprobe-hooks from the environment alone (nothing in the
# driving scripts dumps), each act ending in a report. `make demo` runs it:
#   bash examples/demo.sh TRAIN_VENV_BIN VLLM_VENV_BIN [OUT_DIR]   (default examples/msprobe_dump)
#
# 1. One checkpoint's prefill: verl's FSDP2 engine and vLLM's engine on the same prompts, vLLM on the
#    very same weights (nothing may be named), then on a copy with one planted fault (it must be named).
# 2. The RL loop (cpu_kit/rl_loop.py): vLLM rolls out and returns its log-probs, verl recomputes them
#    and takes a real update, the new weights go to the same running vLLM engine; one tensor is left
#    out of the hand-over from global step 2 on (a sync fault): the run view must say since when.
# 3. The RL loop with a fault only decode steps see (the CPU kit's vLLM plugin, installed in the vLLM
#    venv only): prefill clean, a gap on the response tokens, decode pairs naming the module.
# The engines' own output goes to OUT_DIR/logs/, the terminal gets the answers.
set -euo pipefail
DEMO_OUT=msprobe_dump source "$(dirname "$0")/demo_lib.sh"

answer() { # align + compare one act's dumps: ACT TRAIN_ROOT GENERATE_ROOT [compare options]
	local act=$out/$1 train=$2 generate=$3
	shift 3
	echo "== align + compare"
	"$train_bin/msprobe-hooks" align "$train" "$generate" -o "$act/pairs.jsonl"
	"$train_bin/msprobe-hooks" compare "$act/pairs.jsonl" -o "$act/report" "$@"
}

fault=$(PYTHONPATH=.. "$train_bin/python" -c \
	'from cpu_kit import demo_inputs as d; print(f"model.{d.PERTURBED_MODULE}", d.PERTURBATION)')
module=${fault%% *}
factor=${fault##* }

echo "== inputs: a tiny random Qwen2, a copy with $module x $factor, four prompts"
PYTHONPATH=.. "$train_bin/python" -m cpu_kit.demo_inputs "$out/inputs"
prompts=$out/inputs/prompts.jsonl
export DUMP_ON=1 PROMPTS_ONLY=1 TORCHDYNAMO_DISABLE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_RPC_BASE_PATH=$rpc

echo
echo "#### 1. one checkpoint's prefill"
echo "== training side: verl's FSDP2 engine recomputes log-probs (one prompt-only dump per sample)"
MSPROBE_HOOKS_OUTPUT_DIR=$out/prefill/train MSPROBE_ACTOR_CONFIG=$PWD/msprobe_l0.json quietly train \
	"$train_bin/msprobe-hooks" run -- "$train_bin/python" cpu_demo.py --model "$out/inputs/model" --prompts "$prompts"
for checkpoint in model perturbed; do
	echo
	echo "== inference side: vLLM's engine (CPU) generates for the same prompts from inputs/$checkpoint"
	MSPROBE_HOOKS_OUTPUT_DIR=$out/prefill/$checkpoint MSPROBE_GENERATE_CONFIG=$PWD/msprobe_l0.json \
		quietly "vllm-$checkpoint" \
		"$vllm_bin/msprobe-hooks" run -- "$vllm_bin/python" vllm_generate.py "$out/inputs/$checkpoint" "$prompts"
	answer "prefill/$checkpoint" "$out/prefill/train/actor" "$out/prefill/$checkpoint/generate"
done
echo "expected: no divergence on inputs/model; $module output on inputs/perturbed"

loop() { # the RL loop with the hooks on: NAME MSPROBE_CONFIG [rl_loop options]
	local name=$1 config=$2
	shift 2
	MSPROBE_HOOKS_OUTPUT_DIR=$out/$name/dumps MSPROBE_ACTOR_CONFIG=$config MSPROBE_GENERATE_CONFIG=$config \
		quietly "$name" "$train_bin/msprobe-hooks" run -- "$train_bin/python" ../cpu_kit/rl_loop.py \
		--model "$out/inputs/model" --prompts "$prompts" --out "$out/$name/out" --vllm-python "$vllm_bin/python" "$@"
	grep -h "max token gap" "$out/logs/$name.log"
}

echo
echo "#### 2. the RL loop: $module left out of the weight hand-over from global step 2 on"
loop sync_fault "$PWD/msprobe_l0.json" --iterations 2 --drop-tensor "$module.weight" --at-step 2
answer sync_fault "$out/sync_fault/dumps/actor" "$out/sync_fault/dumps/generate" \
	--tensorboard "$out/sync_fault/tensorboard"
echo "expected: global step 1 clean; global step 2 the first to diverge, at ${module#model.} output"

echo
echo "#### 3. the RL loop: $module x $factor in vLLM's decode steps only (the CPU kit's plugin)"
DUMP_SEQUENCES=1 CPU_KIT_DECODE_FAULT="$module:$factor" loop decode_fault "$PWD/msprobe_l0_tensor.json" --iterations 1
answer decode_fault "$out/decode_fault/dumps/actor" "$out/decode_fault/dumps/generate"
echo "expected: prefill no divergence; every decode token diverges at ${module#model.} output; decode path"

echo
echo "reports: $out/{prefill/model,prefill/perturbed,sync_fault,decode_fault}/report/index.html"
echo "TensorBoard: tensorboard --logdir $out/sync_fault/tensorboard; engine logs: $out/logs/"
