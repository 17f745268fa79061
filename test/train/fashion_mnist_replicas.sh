#!/bin/bash
# usage: fashion_mnist_replicas.sh BINARY: the main job's local SGD and DiLoCo with --deterministic --replicas 4
# (virtual replicas) print the same weights digest at world sizes 1, 2 and 4 (threads) and under mpirun -n 2; a run
# stopped mid-period at world size 2 and resumed at world size 4 ends with the uninterrupted run's digest; the
# digests differ from deterministic DDP's (the local steps did something); and the flag combinations that cannot
# work are refused by name.
set -euo pipefail
bin="$1"
dir="${TEST_TMPDIR:-$(mktemp -d)}/fmreplicas"
mkdir -p "$dir"
log="$dir/log.txt"
fail() { echo "FAIL: $*"; cat "$log"; exit 1; }
digest() {  # ARGS...: runs the job, prints its weights digest
  timeout --kill-after=5 300 "$@" >"$log" 2>&1 || fail "$* exited non-zero"
  grep -E '^(epoch|weights|communication)' "$log" >&2
  sed -n 's/^weights: \([0-9a-f]\{16\}\) .*/\1/p' "$log"
}
# 8 steps an epoch, 16 in all; the CNN has dropout (masks keyed by each sample's place in the global batch).
common=(--deterministic --model cnn --micro-batches 8 --batch-size 32 --limit-train 256 --limit-test 64 --epochs 2
  --optimizer adamw --lr 0.002)
ddp=$(digest "$bin" "${common[@]}" --world-size 1)
for policy in "--local-sgd 3 --local-sgd-warmup 4 --average-optimizer-state" "--diloco 5"; do
  # shellcheck disable=SC2206
  run=("${common[@]}" $policy --replicas 4)
  ref=$(digest "$bin" "${run[@]}" --world-size 1)
  [[ "$ref" =~ ^[0-9a-f]{16}$ ]] || fail "$policy: no weights digest at world size 1"
  [[ "$ref" != "$ddp" ]] || fail "$policy: the digest is deterministic DDP's ($ddp)"
  grep -q "replica 0's; the same for every world size dividing 4" "$log" || fail "$policy: the digest line"
  for ws in 2 4; do
    got=$(digest "$bin" "${run[@]}" --world-size "$ws")
    [[ "$got" == "$ref" ]] || fail "$policy: world size $ws: weights $got, world size 1: $ref"
  done
  grep -q '^communication: ' "$log" || fail "$policy: no communication line"
  got=$(digest mpirun -n 2 "$bin" "${run[@]}" --backend mpi)
  [[ "$got" == "$ref" ]] || fail "$policy: mpirun -n 2: weights $got, world size 1: $ref"
  # Stopped after step 11 (mid-period for both: local SGD averages after steps 7, 10, 13, DiLoCo after 5, 10, 15).
  digest "$bin" "${run[@]}" --world-size 2 --max-steps 11 --checkpoint "$dir/ckpt" >/dev/null
  grep -q '^stopped after 11 optimizer steps (--max-steps) at epoch 2, step 3' "$log" || fail "$policy: no stop line"
  got=$(digest "$bin" "${run[@]}" --world-size 4 --resume "$dir/ckpt")
  [[ "$got" == "$ref" ]] || fail "$policy: stopped at 2 ranks, resumed at 4: weights $got, uninterrupted: $ref"
  echo "$policy --replicas 4: weights $ref at world sizes 1, 2, 4, under mpirun -n 2 and resumed from 2 at 4"
done
# Misuse, each refused by name.
refused() {  # EXPECTED ARGS...: the job must fail and say EXPECTED
  local want="$1"
  shift
  if timeout 60 "$bin" --model mlp --batch-size 32 --limit-train 64 --limit-test 32 "$@" >"$log" 2>&1; then
    fail "accepted: $*"
  fi
  grep -qF -- "$want" "$log" || fail "no clear error for: $* (want: $want)"
}
refused "--replicas is for --local-sgd or --diloco with --deterministic" --local-sgd 4 --replicas 4
refused "add --replicas R" --deterministic --local-sgd 4
refused "--replicas 3 needs --micro-batches (8) to be a multiple of it" --deterministic --diloco 4 --replicas 3
refused "LocalSgd: 4 virtual replicas cannot be shared by 8 ranks" --deterministic --local-sgd 2 --replicas 4 \
  --world-size 8
# One replica per rank resumes at the same world size only.
"$bin" --model mlp --batch-size 32 --limit-train 64 --limit-test 32 --local-sgd 2 --world-size 2 --max-steps 1 \
  --checkpoint "$dir/per_rank.ckpt" >"$log" 2>&1 || fail "per-rank local SGD with --checkpoint"
refused "holds the replicas of 2 ranks and this run has 4" --local-sgd 2 --world-size 4 --resume "$dir/per_rank.ckpt"
echo PASS
