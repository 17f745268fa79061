#!/bin/bash
# usage: fashion_mnist_deterministic.sh BINARY: the main job with --deterministic prints the same weights digest
# for world sizes 1, 2 and 4 (threads) and under mpirun -n 2, for bucket caps 1 KiB and 25 MiB, for the CNN (with
# dropout) and the MLP; and a run stopped mid-epoch at world size 2 and resumed at world size 4 ends with the
# uninterrupted run's digest; with --clip-grad-norm too. With --zero 1 (the optimizer state sharded) the digests
# are the same, and a sharded checkpoint from world size 2 resumes at 1 and 4, sharded or not; with --zero 2 (and
# the gradients kept per slice between steps) and --overlap-update (each bucket updated as it lands) too.
set -euo pipefail
bin="$1"
dir="${TEST_TMPDIR:-$(mktemp -d)}/fmdet"
mkdir -p "$dir"
log="$dir/log.txt"
fail() { echo "FAIL: $*"; exit 1; }
digest() {  # ARGS...: runs the job, prints its weights digest
  timeout --kill-after=5 300 "$@" >"$log" 2>&1 || { cat "$log"; fail "$* exited non-zero"; }
  grep -E '^(fashion_mnist|epoch|weights)' "$log" >&2
  sed -n 's/^weights: \([0-9a-f]\{16\}\) .*/\1/p' "$log"
}
for model in cnn mlp; do
  common=(--deterministic --model "$model" --micro-batches 4 --batch-size 32 --limit-train 256 --limit-test 128
    --epochs 2 --optimizer adamw)
  ref=$(digest "$bin" "${common[@]}" --world-size 1)
  [[ "$ref" =~ ^[0-9a-f]{16}$ ]] || fail "$model: no weights digest at world size 1"
  for ws in 2 4; do
    for cap in 0.001 25; do
      got=$(digest "$bin" "${common[@]}" --world-size "$ws" --bucket-cap-mb "$cap")
      [[ "$got" == "$ref" ]] || fail "$model: world size $ws, cap $cap MiB: weights $got, world size 1: $ref"
    done
  done
  got=$(digest mpirun -n 2 "$bin" "${common[@]}" --backend mpi --bucket-cap-mb 0.001)
  [[ "$got" == "$ref" ]] || fail "$model: mpirun -n 2: weights $got, world size 1: $ref"
  # Stopped mid-epoch 2 (step 3 of 8) at world size 2, resumed at world size 4.
  digest "$bin" "${common[@]}" --world-size 2 --max-steps 11 --checkpoint "$dir/$model.ckpt" >/dev/null
  grep -q '^stopped after 11 optimizer steps (--max-steps) at epoch 2, step 3' "$log" || fail "$model: no stop line"
  got=$(digest "$bin" "${common[@]}" --world-size 4 --resume "$dir/$model.ckpt")
  [[ "$got" == "$ref" ]] || fail "$model: resumed at world size 4: weights $got, uninterrupted: $ref"
  # ZeRO-1: the same digest at world sizes 2 and 4 and under MPI; its checkpoint re-cut at 1 (unsharded) and 4.
  for ws in 2 4; do
    got=$(digest "$bin" "${common[@]}" --world-size "$ws" --bucket-cap-mb 0.001 --zero 1)
    [[ "$got" == "$ref" ]] || fail "$model: --zero 1 at world size $ws: weights $got, world size 1: $ref"
  done
  got=$(digest mpirun -n 2 "$bin" "${common[@]}" --backend mpi --bucket-cap-mb 0.001 --zero 1)
  [[ "$got" == "$ref" ]] || fail "$model: --zero 1 under mpirun -n 2: weights $got, world size 1: $ref"
  grep -q '^ZeRO-1 adamw over 2 ranks: optimizer state [0-9]* bytes on rank 0 (unsharded: ' "$log" ||
    fail "$model: --zero 1 printed no state bytes"
  digest "$bin" "${common[@]}" --world-size 2 --max-steps 11 --zero 1 --checkpoint "$dir/$model.zero.ckpt" >/dev/null
  for resume in "--world-size 1 --zero 0" "--world-size 4 --zero 1" "--world-size 4 --zero 2"; do
    # shellcheck disable=SC2086
    got=$(digest "$bin" "${common[@]}" $resume --resume "$dir/$model.zero.ckpt")
    [[ "$got" == "$ref" ]] || fail "$model: ZeRO-1 checkpoint resumed with $resume: weights $got, uninterrupted: $ref"
  done
  # The update overlapped with the reductions (--overlap-update), alone at world size 4 and over ZeRO-1 under MPI.
  got=$(digest "$bin" "${common[@]}" --world-size 4 --bucket-cap-mb 0.001 --overlap-update)
  [[ "$got" == "$ref" ]] || fail "$model: --overlap-update at world size 4: weights $got, world size 1: $ref"
  grep -q 'each bucket updated as its reduction lands' "$log" || fail "$model: --overlap-update did not say so"
  got=$(digest mpirun -n 2 "$bin" "${common[@]}" --backend mpi --bucket-cap-mb 0.001 --zero 1 --overlap-update)
  [[ "$got" == "$ref" ]] || fail "$model: --zero 1 --overlap-update under mpirun -n 2: weights $got, world size 1: $ref"
  # ZeRO-2 (each rank keeps its slices' gradients between steps): threads, and MPI's shared-memory gradients.
  got=$(digest "$bin" "${common[@]}" --world-size 2 --bucket-cap-mb 0.001 --zero 2)
  [[ "$got" == "$ref" ]] || fail "$model: --zero 2 at world size 2: weights $got, world size 1: $ref"
  grep -q '^ZeRO-2: rank 0 keeps [0-9]* of [0-9]* gradient bytes between steps' "$log" ||
    fail "$model: --zero 2 printed no gradient bytes"
  got=$(digest mpirun -n 2 "$bin" "${common[@]}" --backend mpi --zero 2 --overlap-update)
  [[ "$got" == "$ref" ]] || fail "$model: --zero 2 --overlap-update under mpirun -n 2: weights $got, world size 1: $ref"
  echo "$model: weights $ref at world sizes 1, 2, 4, caps 1 KiB and 25 MiB, under MPI, and resumed at another world size; the same with --zero 1, --zero 2 and --overlap-update"
done
# --clip-grad-norm keeps it: the clipped gradients are the same at every world size, and clipping changes the run.
base=(--deterministic --model mlp --micro-batches 4 --batch-size 32 --limit-train 256 --limit-test 128 --epochs 2)
clip=("${base[@]}" --clip-grad-norm 0.05)
unclipped=$(digest "$bin" "${base[@]}" --world-size 1)
ref=$(digest "$bin" "${clip[@]}" --world-size 1)
[[ "$ref" =~ ^[0-9a-f]{16}$ && "$ref" != "$unclipped" ]] || fail "clipped mlp: weights $ref, unclipped $unclipped"
got=$(digest "$bin" "${clip[@]}" --world-size 4)
[[ "$got" == "$ref" ]] || fail "clipped mlp: world size 4: weights $got, world size 1: $ref"
got=$(digest mpirun -n 2 "$bin" "${clip[@]}" --backend mpi)
[[ "$got" == "$ref" ]] || fail "clipped mlp: mpirun -n 2: weights $got, world size 1: $ref"
got=$(digest "$bin" "${clip[@]}" --world-size 4 --zero 2)  # clipping sees the whole gradients before the step
[[ "$got" == "$ref" ]] || fail "clipped mlp: world size 4, --zero 2: weights $got, world size 1: $ref"
echo "mlp with --clip-grad-norm 0.05: weights $ref at world sizes 1, 4 and under MPI (unclipped: $unclipped)"
# Misuse: a world size that does not divide the micro-batches.
if "$bin" --deterministic --micro-batches 4 --world-size 3 --batch-size 24 --limit-train 64 --limit-test 32 >"$log" 2>&1; then
  fail "world size 3 with 4 micro-batches was accepted"
fi
grep -q 'needs the world size (3) to divide --micro-batches (4)' "$log" || { cat "$log"; fail "no clear error for world size 3"; }
echo PASS
