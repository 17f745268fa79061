#!/bin/bash
# usage: gpt_elastic.sh BINARY: the GPT job in place over Gloo (--elastic --deterministic): 4 processes on a file
# store, rank 2 SIGKILLed after iteration 40, then a process started with --join (--max-world-size 4): 4 -> 3 -> 4,
# each change one line, and the survivors end with the uninterrupted run's weights digest.
set -euo pipefail
source "${TEST_SRCDIR:-$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../..}/${TEST_SRCDIR:+$TEST_WORKSPACE/}test/tools/own_processes.sh"
bin="$(realpath "$1")"
dir="${TEST_TMPDIR:-$(mktemp -d)}/gpt_elastic"
rm -rf "$dir" && mkdir -p "$dir"
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.log; do echo "== $f" && tail -4 "$f"; done
  exit 1
}
common=(--deterministic --micro-batches 12 --batch-size 12 --n-layer 1 --n-head 2 --n-embd 32 --block-size 16
  --iters 400 --warmup 10 --eval-interval 0 --sample 0 --log-interval 20)
digest_of() { sed -n 's/^weights: \([0-9a-f]\{16\}\) .*/\1/p' "$1" | tail -1; }
timeout 120 "$bin" "${common[@]}" --world-size 1 >"$dir/ref.log" 2>&1 || fail "threads run failed"
ref=$(digest_of "$dir/ref.log")
[[ "$ref" =~ ^[0-9a-f]{16}$ ]] || fail "no weights digest from the threads run"

flags=("${common[@]}" --backend gloo --elastic --max-world-size 4)
pids=()
for r in 0 1 2 3; do
  env RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r LOCAL_WORLD_SIZE=4 DDP_STORE_FILE="$dir/store" DDP_TIMEOUT=20 \
    timeout 200 "$bin" "${flags[@]}" >"$dir/rank$r.log" 2>&1 &
  pids+=($!)
done
wait_for() {  # wait_for REGEX K: rank 0's log has K lines matching REGEX (up to 60 s)
  for _ in $(seq 600); do
    (($(grep -Ec "$1" "$dir/rank0.log" 2>/dev/null || true) >= $2)) && return 0
    sleep 0.1
  done
  fail "rank 0 printed fewer than $2 lines matching '$1'"
}
wait_for '^iter +[0-9]+/400' 2
victim=""
for p in $(own_pids "$bin"); do
  [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == timeout ]] && continue
  if grep -qx "RANK=2" < <(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null); then victim=$p; fi
done
[[ -n "$victim" ]] || fail "no process of rank 2 to kill"
kill -KILL "$victim"
wait_for '^ddp elastic: ' 1
wait_for '^iter +[0-9]+/400' 3  # (a progress line at world size 3 first)
env DDP_STORE_FILE="$dir/store" DDP_TIMEOUT=20 timeout 200 "$bin" "${flags[@]}" --join >"$dir/joiner.log" 2>&1 &
joiner=$!
for p in "${pids[0]}" "${pids[1]}" "${pids[3]}" "$joiner"; do wait "$p" || fail "a survivor or the joiner failed"; done
mapfile -t lines < <(grep "^ddp elastic: " "$dir/rank0.log")
re1='^ddp elastic: rank 2 lost at step ([0-9]+) \(it ended: [^)]*\); continuing at world size 3 from step ([0-9]+) after'
re2='^ddp elastic: rank 3 joined at step ([0-9]+); continuing at world size 4 from step ([0-9]+) after'
[[ "${lines[0]:-}" =~ $re1 && "${BASH_REMATCH[1]}" == "${BASH_REMATCH[2]}" ]] || fail "change 1: '${lines[0]:-}'"
s1=${BASH_REMATCH[1]}
[[ "${lines[1]:-}" =~ $re2 && "${BASH_REMATCH[1]}" == "${BASH_REMATCH[2]}" ]] || fail "change 2: '${lines[1]:-}'"
s2=${BASH_REMATCH[1]}
grep -q "^membership changes: 4 -> 3 ranks at iteration $s1, 3 -> 4 ranks at iteration $s2\$" "$dir/rank0.log" ||
  fail "rank 0 did not list the changes"
got=$(digest_of "$dir/rank0.log")
[[ "$got" == "$ref" ]] || fail "weights $got, uninterrupted: $ref"
echo "PASS: GPT over Gloo 4 -> 3 -> 4 (rank 2 SIGKILLed at iteration $s1, a joiner at $s2), bitwise ($ref)"
printf '  %s\n' "${lines[@]}"
