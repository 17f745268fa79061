#!/bin/bash
# usage (inside tools/cluster/cluster.sh, on host h0): gloo_cluster.sh FASHION_MNIST
# The main job over Gloo across namespace hosts, one rank per host, launched without MPI (glooexec.sh: rank 0
# serves the store on h0): with --deterministic, 2 and 4 hosts give the weights digest of one process; a rank
# killed (SIGKILL) on another host ends every other rank naming it; a rank stopped (SIGSTOP) is named at the
# timeout.
set -uo pipefail
bin="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
exec_="$here/tools/cluster/glooexec.sh"
source "$here/test/tools/own_processes.sh"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; tail -20 "$out"/*.log 2>/dev/null; exit 1; }
common=(--deterministic --model mlp --micro-batches 4 --batch-size 32 --limit-train 512 --limit-test 128 --epochs 1)
digest() { sed -n 's/^\(\[rank 0\] \)\{0,1\}weights: \([0-9a-f]\{16\}\) .*/\2/p' "$1" | head -1; }

"$bin" "${common[@]}" --world-size 1 >"$out/ref.log" 2>&1 || fail "the one-process run failed"
ref=$(digest "$out/ref.log")
[[ "$ref" =~ ^[0-9a-f]{16}$ ]] || fail "no digest from the one-process run"
for hosts in 2 4; do
  "$exec_" 1 "$hosts" "$bin" "${common[@]}" --backend gloo >"$out/h$hosts.log" 2>&1 || fail "$hosts hosts: exit $?"
  got=$(digest "$out/h$hosts.log")
  [[ "$got" == "$ref" ]] || fail "$hosts hosts: weights $got, one process: $ref"
  grep -q "gloo backend, host tensors, world size $hosts" "$out/h$hosts.log" || fail "$hosts hosts: no header"
done
echo "gloo across 2 and 4 hosts: weights $ref, as one process"

# rank_pid R: the pid of rank R's job process (on any host: the namespaces share this PID namespace).
rank_pid() {
  for p in $(own_pids "$bin"); do
    [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == fashion_mnist ]] || continue
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$1" && echo "$p"
  done | head -1
}
# failure SIGNAL EXPECT: 2 hosts, rank 1 gets SIGNAL once training runs; the job must fail with EXPECT on rank 0.
failure() {
  local sig="$1" expect="$2" log="$out/$1.log"
  DDP_TIMEOUT=4 "$exec_" 1 2 "$bin" --model mlp --epochs 5 --backend gloo >"$log" 2>&1 &
  local job=$!
  for _ in $(seq 200); do grep -q "step" "$log" && break; sleep 0.1; done
  local pid
  pid=$(rank_pid 1)
  [[ -n "$pid" ]] || fail "$sig: rank 1 not found"
  local start=$SECONDS
  kill "-$sig" "$pid"
  wait "$job" && fail "$sig: the job succeeded"
  kill -KILL "$pid" 2>/dev/null
  ((SECONDS - start <= 30)) || fail "$sig: the job took $((SECONDS - start)) s to fail"
  grep -E "^\[rank 0\] error: rank 0: .*$expect" "$log" || fail "$sig: rank 0 does not say '$expect'"
}
failure KILL "rank 1 ended"
failure STOP "rank 1 was not in this collective within the timeout of 4 s"
echo "PASS: gloo across hosts: the one-process digest; a killed and a stopped rank named"
