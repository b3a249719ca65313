#!/usr/bin/env bash
# verl's own trainer, `python3 -m verl.trainer.main_ppo`, unchanged, as a user launches it (`make demo-main-ppo`):
# Ray, the v1 trainer, the agent loop, vLLM CPU as the rollout server in a Ray actor, the FSDP2 actor, the weight
# sync after every step (cpu_kit/main_ppo.py; docs/verl-main-ppo.md). The hooks are on from the environment only.
# 1. healthy: fp32 on both sides, two global steps: align pairs every sample with its prefill, cause none.
# 2. the legacy trainer with FSDP's mixed precision at verl's default (a bf16 forward under model_dtype=fp32),
#    vLLM in fp32: cause precision, the whole model.
#   bash examples/demo_main_ppo.sh VERL_E2E_VENV_BIN [OUT_DIR]   (default examples/msprobe_dump/main_ppo)
set -euo pipefail
bin=$(realpath "$1")
cd "$(dirname "$0")/.."
out=$(realpath -m "${2:-examples/msprobe_dump/main_ppo}")
rm -rf "$out" && mkdir -p "$out"
export DUMP_ON=1 PROMPTS_ONLY=1 PYTHONPATH=$("$bin/msprobe-hooks" shim-path)
export MSPROBE_ACTOR_CONFIG=$PWD/examples/msprobe_l0.json MSPROBE_GENERATE_CONFIG=$PWD/examples/msprobe_l0.json

act() { # one main_ppo run of two global steps, then align + compare: NAME [cpu_kit.main_ppo options]
	local name=$1 work=$out/$1
	shift
	MSPROBE_HOOKS_OUTPUT_DIR=$work/dumps "$bin/python" -m cpu_kit.main_ppo "$work" --steps 2 "$@" >"$out/$name.log" 2>&1 || {
		tail -n 40 "$out/$name.log"
		echo "failed: see $out/$name.log and $work/main_ppo.log" >&2
		return 1
	}
	grep -h "^global step" "$out/$name.log" # the launcher's line a step, verl's own metric in it
	"$bin/msprobe-hooks" align "$work/dumps/actor" "$work/dumps/generate" -o "$work/pairs.jsonl" | tail -n 1
	"$bin/msprobe-hooks" compare "$work/pairs.jsonl" -o "$work/report" | sed -n 1p
}

echo "#### 1. healthy: the v1 trainer, fp32 on both sides"
act healthy
echo "expected: cause: none"
echo
echo "#### 2. the legacy trainer with verl's default FSDP mixed precision: a bf16 forward under model_dtype=fp32"
act bf16 --legacy "~actor_rollout_ref.actor.fsdp_config.mixed_precision"
echo "expected: cause: precision, model dtype bfloat16 (training) vs float32 (rollout)"
echo
echo "reports: $out/{healthy,bf16}/report/index.html; verl's console: $out/{healthy,bf16}/main_ppo.log"
