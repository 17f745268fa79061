#!/bin/bash
# usage: fashion_mnist_gloo.sh BINARY [torchrun]: the main job over Gloo, one rank per process, launched without
# mpirun. By hand with a file store (DDP_STORE_FILE, as under srun) and with rank 0 serving a TCP store
# (MASTER_ADDR/MASTER_PORT, as PyTorch's env://), at 2 and 4 ranks: --deterministic gives the threads run's weights
# digest. A rank killed mid-epoch (SIGKILL) ends the other ranks within the timeout, naming it. With "torchrun":
# the same digest under Debian's torchrun (its agent serves the store), or SKIPPED where torchrun is missing.
set -euo pipefail
source "${TEST_SRCDIR:-$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../..}/${TEST_SRCDIR:+$TEST_WORKSPACE/}test/tools/own_processes.sh"
bin="$1"
mode="${2:-}"
dir="${TEST_TMPDIR:-$(mktemp -d)}/fmgloo"
rm -rf "$dir" && mkdir -p "$dir"
fail() { echo "FAIL: $*"; for f in "$dir"/*.log; do echo "== $f"; tail -5 "$f"; done; exit 1; }
common=(--deterministic --model mlp --micro-batches 4 --batch-size 32 --limit-train 512 --limit-test 128 --epochs 1)
digest_of() { sed -n 's/^\(\[default0\]:\)\{0,1\}weights: \([0-9a-f]\{16\}\) .*/\2/p' "$1" | head -1; }

timeout 300 "$bin" "${common[@]}" --world-size 1 >"$dir/ref.log" 2>&1 || fail "threads run failed"
ref=$(digest_of "$dir/ref.log")
[[ "$ref" =~ ^[0-9a-f]{16}$ ]] || fail "no weights digest from the threads run"

# launch N METHOD [ARGS...]: N processes of the job with a launcher's variables; waits for all.
launch() {
  local n="$1" method="$2"
  shift 2
  local pids=() port=$((20000 + RANDOM % 20000))
  for ((r = 0; r < n; r++)); do
    local env=(RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n DDP_TIMEOUT=20)
    if [[ "$method" == file ]]; then env+=(DDP_STORE_FILE="$dir/store.$n"); fi
    if [[ "$method" == env ]]; then env+=(MASTER_ADDR=127.0.0.1 MASTER_PORT=$port); fi
    env "${env[@]}" timeout 120 "$bin" "$@" >"$dir/rank$r.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

if [[ "$mode" == torchrun ]]; then
  if ! command -v torchrun >/dev/null; then
    echo "SKIPPED: torchrun is not installed (Debian's python3-torch provides it)"
    exit 0
  fi
  # (a port of its own: torchrun's default 29500 may be another test's at the same moment)
  timeout 300 torchrun --master_port=$((20000 + RANDOM % 20000)) --redirects 1 --tee 1 --nproc_per_node=2 \
    --no_python "$bin" "${common[@]}" --backend gloo \
    >"$dir/torchrun.log" 2>&1 || fail "torchrun exited non-zero"
  got=$(digest_of "$dir/torchrun.log")
  [[ "$got" == "$ref" ]] || fail "torchrun, 2 ranks: weights $got, threads: $ref"
  echo "PASS: torchrun --nproc_per_node=2 --backend gloo: weights $got as on threads"
  exit 0
fi

for n in 2 4; do
  for method in file env; do
    rm -rf "$dir/store.$n"
    launch "$n" "$method" "${common[@]}" --backend gloo || fail "$method store, $n ranks: a rank failed"
    got=$(digest_of "$dir/rank0.log")
    [[ "$got" == "$ref" ]] || fail "$method store, $n ranks: weights $got, threads: $ref"
    grep -q "gloo backend, host tensors, world size $n" "$dir/rank0.log" || fail "$method: no header"
  done
done

# A rank killed mid-epoch: the others end within the timeout (20 s), naming it.
# The earlier runs' logs go first: until the launcher (a background subshell) opens rank0.log anew, the wait below
# would read the last run's progress lines.
rm -rf "$dir/store.2" "$dir"/rank*.log
launch 2 file --model mlp --epochs 5 --backend gloo &
launcher=$!
# Wait for rank 0's first progress line ("epoch 1/5  step N/M": a step both ranks took, so rank 1 runs) while the
# job runs; an instrumented build on a loaded machine can take much longer than a plain one to get there. At most
# 300 s. (The header's "938 steps" is not progress.)
progress='^epoch [0-9]+/[0-9]+ +step [0-9]+/'
for _ in $(seq 1500); do
  grep -Eq "$progress" "$dir/rank0.log" 2>/dev/null && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.2
done
kill -0 "$launcher" 2>/dev/null || fail "the 5-epoch job ended before rank 1 could be killed"
grep -Eq "$progress" "$dir/rank0.log" || fail "rank 0 printed no progress line within 300 s"
# Rank 1's process: the job binary (not its timeout wrapper, nor this script, whose command line names the binary
# too) with RANK=1 in its environment.
pid1=""
for _ in $(seq 50); do
  for p in $(own_pids "$bin"); do
    [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == timeout ]] && continue
    if { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx "RANK=1"; then pid1=$p; fi
  done
  [[ -n "$pid1" ]] && break
  sleep 0.2
done
[[ -n "$pid1" ]] || fail "could not find rank 1's process"
start=$SECONDS
kill -KILL "$pid1"
wait "$launcher" && fail "the job succeeded with rank 1 killed"
((SECONDS - start < 60)) || fail "rank 0 took $((SECONDS - start)) s to end"
grep -q "rank 1 ended" "$dir/rank0.log" || fail "rank 0's error does not name rank 1"
echo "PASS: Gloo by hand (file and TCP stores, 2 and 4 ranks) gives the threads digest $ref; a killed rank is named"
