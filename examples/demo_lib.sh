# What both demos start with (sourced by demo.sh and demo_moe.sh): the two venvs' bin folders from $1 and $2,
# then into examples/, the output folder from $3 (default: $DEMO_OUT) emptied, vLLM's IPC folder cleaned at
# exit, and `quietly`.
train_bin=$(realpath "$1")
vllm_bin=$(realpath "$2")
cd "$(dirname "${BASH_SOURCE[0]}")"
out=$(realpath -m "${3:-$DEMO_OUT}")
rm -rf "$out" && mkdir -p "$out/logs"
rpc=$(mktemp -d) && trap 'rm -rf "$rpc"' EXIT # vLLM's IPC sockets, cleaned

quietly() { # run a step with its output in a log file; on failure show the end of it
	local log=$out/logs/$1.log
	shift
	"$@" >"$log" 2>&1 || {
		tail -n 40 "$log"
		echo "failed: see $log" >&2
		return 1
	}
}
