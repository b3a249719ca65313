#!/usr/bin/env bash
# The routing demo on this CPU (`make demo-moe`; `make demo` stays the dense one): a tiny Qwen3-MoE through
# verl's FSDP2 engine and vLLM's engine, the routers' choices compared, twice: vLLM on the same checkpoint (every
# token keeps its experts), then on a copy whose layer-1 router has one weight row scaled (cpu_kit/moe_inputs.py
# planted it so that a known share of the tokens goes to other experts; the report must say "routing diverges at
# layer 1" with that share). Both sides dump statistics with no routing switch: each side's process writes the
# experts its routers chose (routed_experts.jsonl, beside its log) for every dumped forward; vLLM runs at tensor
# parallel 2 on the clean checkpoint.
#   bash examples/demo_moe.sh TRAIN_VENV_BIN VLLM_VENV_BIN [OUT_DIR]   (default examples/msprobe_dump/moe)
set -euo pipefail
DEMO_OUT=msprobe_dump/moe source "$(dirname "$0")/demo_lib.sh"

echo "== inputs: a tiny random Qwen3-MoE (3 layers of 8 experts, top 2), a copy with a router fault, four prompts"
PYTHONPATH=.. "$train_bin/python" -m cpu_kit.moe_inputs "$out/inputs" | grep -E "^(moe|moe-router):"
prompts=$out/inputs/prompts.jsonl

export DUMP_ON=1 PROMPTS_ONLY=1 TORCHDYNAMO_DISABLE=1
echo "== training side: verl's FSDP2 engine, prompt-only dumps (statistics; the routers' choices recorded beside)"
MSPROBE_HOOKS_OUTPUT_DIR=$out/train MSPROBE_ACTOR_CONFIG=$PWD/msprobe_l0.json quietly train \
	"$train_bin/msprobe-hooks" run -- "$train_bin/python" cpu_demo.py --model "$out/inputs/moe" --prompts "$prompts"

for run in "moe 2" "moe-router 1"; do
	set -- $run
	echo
	echo "== inference side: vLLM (tensor parallel $2) on inputs/$1"
	MSPROBE_HOOKS_OUTPUT_DIR=$out/$1 MSPROBE_GENERATE_CONFIG=$PWD/msprobe_l0.json \
		VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=$([ "$2" = 2 ] && echo "0|1" || echo auto) \
		VLLM_RPC_BASE_PATH=$rpc quietly "vllm-$1" "$vllm_bin/msprobe-hooks" run -- "$vllm_bin/python" \
		vllm_generate.py "$out/inputs/$1" "$prompts" --tensor-parallel-size "$2"
	echo "== align + compare"
	"$train_bin/msprobe-hooks" align "$out/train/actor" "$out/$1/generate" -o "$out/$1/pairs.jsonl" | sed -n 1p
	"$train_bin/msprobe-hooks" compare "$out/$1/pairs.jsonl" -o "$out/$1/report" | sed -n 1,2p
done
echo
echo "expected: routing agrees on inputs/moe; on inputs/moe-router: $(cd .. && "$train_bin/python" -c \
	'from pathlib import Path; from cpu_kit.moe_inputs import RouterFault as F; f = F.read(Path("'"$out"'/inputs/moe-router"))
print(f"routing diverges at layer {f.layer}, {f.flipped} of {f.tokens} tokens ({f.share:.1%}) planted")')"
echo "reports: $out/{moe,moe-router}/report/index.html; engine logs: $out/logs/"
