#!/usr/bin/env bash
# The whole story on this CPU, dumped by msprobe-hooks from the environment alone (nothing in the launched
# programs dumps), each act ending in its answer. `make demo` runs it:
#   bash examples/demo.sh TRAIN_VENV_BIN VLLM_VENV_BIN VERL_E2E_VENV_BIN [OUT_DIR]   (default examples/msprobe_dump)
#
# 1-2. verl's own trainer, `python3 -m verl.trainer.main_ppo`, unchanged, as a user launches it (VERL_E2E_VENV_BIN's
#    interpreter: verl and vLLM CPU in one): Ray, the agent loop, vLLM as the rollout server in a Ray actor, the FSDP2
#    actor, the weight sync after every step (cpu_kit/main_ppo.py; docs/verl-main-ppo.md). Two global steps each.
#    1. healthy: the v1 trainer, fp32 on both sides, whole sequences dumped too (DUMP_SEQUENCES=1, tensor mode):
#       align pairs every sample with its prefill and each response token after the first with its decode step,
#       cause none.
#    2. the legacy trainer with FSDP's mixed precision at verl's default (a bf16 forward under model_dtype=fp32),
#       vLLM in fp32: cause precision, the whole model. The job joins a Ray cluster started apart (`ray start
#       --head`, local addresses) without the hooks' variables: they reach its workers through `msprobe-hooks
#       ray-env`'s runtime_env, as on a multi-node cluster.
# 3. What main_ppo cannot show: a fault only vLLM's decode steps see (the CPU kit's vLLM plugin, installed in the vLLM
#    venv only), in the CPU kit's RL loop (cpu_kit/rl_loop.py: vLLM rolls out, verl's FSDP2 engine recomputes the
#    log-probs): prefill clean, a gap on the response tokens, decode pairs naming the module.
# The engines' own output goes to OUT_DIR/logs/ (main_ppo's: OUT_DIR/main_ppo/NAME/main_ppo.log), the terminal gets
# the answers.
set -euo pipefail
verl_bin=$(realpath "$3")
set -- "$1" "$2" ${4:+"$4"}
DEMO_OUT=msprobe_dump source "$(dirname "$0")/demo_lib.sh"
config=$PWD/msprobe_l0.json

answer() { # align + compare one act's dumps: BIN ACT_DIR [compare options]: align's count of pairs, the cause line
	local bin=$1 act=$2
	shift 2
	"$bin/msprobe-hooks" align "$act/dumps/actor" "$act/dumps/generate" -o "$act/pairs.jsonl" | grep "^align: "
	"$bin/msprobe-hooks" compare "$act/pairs.jsonl" -o "$act/report" "$@" | sed -n 1p
}

main_ppo() { # one main_ppo run of two global steps with the hooks on: NAME [cpu_kit.main_ppo options]
	local name=$1 work=$out/main_ppo/$1
	shift
	(cd .. && MSPROBE_HOOKS_OUTPUT_DIR=$work/dumps PYTHONPATH=$("$verl_bin/msprobe-hooks" shim-path) \
		quietly "main_ppo-$name" "$verl_bin/python" -m cpu_kit.main_ppo "$work" --steps 2 "$@")
	grep -h "^global step" "$out/logs/main_ppo-$name.log" # the launcher's line a step, verl's own metric in it
	answer "$verl_bin" "$work"
}

export DUMP_ON=1 PROMPTS_ONLY=1 MSPROBE_ACTOR_CONFIG=$config MSPROBE_GENERATE_CONFIG=$config

echo "#### 1. verl's own main_ppo, the v1 trainer, fp32 on both sides: healthy; prefill and decode steps compared"
DUMP_SEQUENCES=1 MSPROBE_ACTOR_CONFIG=$PWD/msprobe_l0_tensor.json MSPROBE_GENERATE_CONFIG=$PWD/msprobe_l0_tensor.json \
	main_ppo healthy
echo "expected: cause: none"

echo
echo "#### 2. main_ppo, the legacy trainer with verl's default FSDP mixed precision: a bf16 forward under model_dtype=fp32"
echo "     on a Ray cluster started apart (ray start --head), the hooks given to its workers by msprobe-hooks ray-env"
main_ppo bf16 --legacy --cluster "~actor_rollout_ref.actor.fsdp_config.mixed_precision"
echo "expected: cause: precision, model dtype bfloat16 (training) vs float32 (rollout)"

fault=$(PYTHONPATH=.. "$train_bin/python" -c \
	'from cpu_kit import demo_inputs as d; print(f"model.{d.PERTURBED_MODULE}", d.PERTURBATION)')
module=${fault%% *}
factor=${fault##* }
echo
echo "#### 3. the CPU kit's RL loop: $module x $factor in vLLM's decode steps only (the CPU kit's plugin)"
PYTHONPATH=.. quietly inputs "$train_bin/python" -m cpu_kit.demo_inputs "$out/inputs"
act=$out/decode_fault
TORCHDYNAMO_DISABLE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_RPC_BASE_PATH=$rpc DUMP_SEQUENCES=1 \
	CPU_KIT_DECODE_FAULT="$module:$factor" MSPROBE_HOOKS_OUTPUT_DIR=$act/dumps \
	MSPROBE_ACTOR_CONFIG=$PWD/msprobe_l0_tensor.json MSPROBE_GENERATE_CONFIG=$PWD/msprobe_l0_tensor.json \
	quietly decode_fault "$train_bin/msprobe-hooks" run -- "$train_bin/python" ../cpu_kit/rl_loop.py \
	--model "$out/inputs/model" --prompts "$out/inputs/prompts.jsonl" --out "$act/out" \
	--vllm-python "$vllm_bin/python" --iterations 1
grep -h "max token gap" "$out/logs/decode_fault.log"
answer "$train_bin" "$act"
echo "expected: cause: module (decode), ${module#model.}: prefill no divergence, every decode token diverges there"

echo
echo "reports: $out/{main_ppo/healthy,main_ppo/bf16,decode_fault}/report/index.html; engine logs: $out/logs/"
