#!/bin/bash
# usage: gpt_deterministic.sh BINARY: the GPT job with --deterministic prints the same weights digest at world sizes
# 1, 2 and 4 (threads) and under mpirun -n 2, with ZeRO-1, with dropout and without (the fused attention); a run
# stopped at world size 2 and resumed at world size 4 ends with the uninterrupted run's digest; DiLoCo over 4 virtual
# replicas the same.
set -euo pipefail
bin="$1"
dir="${TEST_TMPDIR:-$(mktemp -d)}/gptdet"
mkdir -p "$dir"
log="$dir/log.txt"
fail() { echo "FAIL: $*"; cat "$log"; exit 1; }
digest() {  # ARGS...: runs the job, prints its weights digest
  timeout --kill-after=5 120 "$@" >"$log" 2>&1 || fail "$* exited non-zero"
  sed -n 's/^weights: \([0-9a-f]\{16\}\).*/\1/p' "$log"
}
common=(--deterministic --micro-batches 4 --batch-size 8 --n-layer 1 --n-head 2 --n-embd 32 --block-size 16
  --iters 12 --warmup 3 --eval-interval 0 --sample 0 --dropout 0.1)
ref=$(digest "$bin" "${common[@]}" --world-size 1)
[[ "$ref" =~ ^[0-9a-f]{16}$ ]] || fail "no weights digest at world size 1"
for ws in 2 4; do
  got=$(digest "$bin" "${common[@]}" --world-size "$ws")
  [[ "$got" == "$ref" ]] || fail "world size $ws: weights $got, world size 1: $ref"
done
got=$(digest "$bin" "${common[@]}" --world-size 4 --zero 1)
[[ "$got" == "$ref" ]] || fail "--zero 1 at world size 4: weights $got, world size 1: $ref"
got=$(digest mpirun -n 2 "$bin" "${common[@]}" --backend mpi)
[[ "$got" == "$ref" ]] || fail "mpirun -n 2: weights $got, world size 1: $ref"
digest "$bin" "${common[@]}" --world-size 2 --max-steps 5 --checkpoint "$dir/ckpt" >/dev/null
grep -q "^stopped after 5 iterations (--max-steps); checkpoint: $dir/ckpt" "$log" || fail "no stop line"
got=$(digest "$bin" "${common[@]}" --world-size 4 --resume "$dir/ckpt")
[[ "$got" == "$ref" ]] || fail "stopped at 2 ranks, resumed at 4: weights $got, uninterrupted: $ref"
# Without dropout the attention is the fused host kernel: the same guarantee.
ref0=$(digest "$bin" "${common[@]}" --dropout 0 --world-size 1)
got=$(digest "$bin" "${common[@]}" --dropout 0 --world-size 4)
[[ "$ref0" =~ ^[0-9a-f]{16}$ && "$got" == "$ref0" ]] || fail "no dropout: world size 4 weights $got, world size 1: $ref0"
# DiLoCo over 4 virtual replicas (--replicas 4): the same digest at world sizes 1 and 4, and across a resume from 2
# ranks at 4 after step 5 (mid-period: outer steps after 3, 6, 9, 12).
local=("${common[@]}" --diloco 3 --replicas 4)
refl=$(digest "$bin" "${local[@]}" --world-size 1)
[[ "$refl" =~ ^[0-9a-f]{16}$ && "$refl" != "$ref" ]] || fail "--diloco --replicas 4: weights $refl (DDP's: $ref)"
got=$(digest "$bin" "${local[@]}" --world-size 4)
[[ "$got" == "$refl" ]] || fail "--diloco --replicas 4 at world size 4: weights $got, world size 1: $refl"
digest "$bin" "${local[@]}" --world-size 2 --max-steps 5 --checkpoint "$dir/local.ckpt" >/dev/null
got=$(digest "$bin" "${local[@]}" --world-size 4 --resume "$dir/local.ckpt")
[[ "$got" == "$refl" ]] || fail "--diloco --replicas 4 stopped at 2 ranks, resumed at 4: weights $got, uninterrupted: $refl"
echo "PASS: every digest is $ref (dropout 0.1), $ref0 (no dropout) and $refl (DiLoCo, 4 virtual replicas)"
