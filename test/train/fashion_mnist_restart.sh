#!/bin/bash
# usage: fashion_mnist_restart.sh BINARY: restart elasticity of the main job (--checkpoint-every K --resume auto).
# A worker is SIGKILLed mid-epoch, after the first checkpoint; the job is started again as each launcher does it, and
# resumes from the newest checkpoint, at the same or another world size; the final --deterministic weights digest
# equals the uninterrupted run's:
#   torchrun --max_restarts 1 --nproc_per_node 2 over Gloo (MLP and CNN): torchrun's agent restarts the workers
#     (SKIPPED where Debian's torchrun is missing);
#   a Slurm requeue (srun's variables by hand, DDP_STORE_FILE, the same job id and directory, SLURM_RESTART_COUNT 1);
#   an mpirun relaunch, from 2 ranks to 4;
# and a torn newest checkpoint falls back to the one before, naming it.
set -euo pipefail
source "${TEST_SRCDIR:-$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../..}/${TEST_SRCDIR:+$TEST_WORKSPACE/}test/tools/own_processes.sh"
bin="$(realpath "$1")"
dir="${TEST_TMPDIR:-$(mktemp -d)}/restart"
rm -rf "$dir" && mkdir -p "$dir"
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.log; do echo "== $f" && tail -8 "$f"; done
  exit 1
}
common=(--deterministic --micro-batches 4 --batch-size 32 --limit-test 128 --epochs 1)
mlp=(--model mlp)                         # 1875 steps of 32: about 3 s at world size 1
cnn=(--model cnn --limit-train 4096)      # 128 steps
digest_of() { sed -n 's/^\(\[default[0-9]\]:\)\{0,1\}weights: \([0-9a-f]\{16\}\) .*/\2/p' "$1" | tail -1; }
reference() {  # MODEL FLAGS...: the uninterrupted run's digest (threads, world size 1)
  local name="$1"
  shift
  timeout 300 "$bin" "${common[@]}" "$@" --world-size 1 >"$dir/$name.ref.log" 2>&1 || fail "$name: threads run failed"
  local d
  d=$(digest_of "$dir/$name.ref.log")
  [[ "$d" =~ ^[0-9a-f]{16}$ ]] || fail "$name: no weights digest from the threads run"
  echo "$d"
}
# kill_after_checkpoint FILE VAR=VALUE LAUNCHER: waits for the job's first checkpoint FILE as long as the job's
# launcher (pid LAUNCHER) runs (each job has its own 300 s timeout: on a loaded machine a 2-rank MPI job can stall
# for tens of seconds, so no shorter wait of its own), then SIGKILLs the job process (not its timeout wrapper) whose
# environment holds VAR=VALUE. The series keeps FILE in place while it writes the next checkpoint, so once seen
# FILE stays.
kill_after_checkpoint() {
  local file="$1" mark="$2" launcher="$3" pid=""
  until [[ -e "$file" ]]; do
    kill -0 "$launcher" 2>/dev/null || fail "the job ended before writing its first checkpoint $file"
    sleep 0.1
  done
  for _ in $(seq 50); do
    for p in $(own_pids "$bin"); do
      [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == timeout ]] && continue
      if grep -qx "$mark" < <(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null); then pid=$p; fi
    done
    [[ -n "$pid" ]] && break
    sleep 0.1
  done
  [[ -n "$pid" ]] || fail "no process with $mark to kill"
  kill -KILL "$pid"
}
# expect_resumed LOG DIGEST WHAT: the log resumed mid-epoch from a checkpoint and ends with DIGEST.
expect_resumed() {
  grep -Eq "resumed from .*: epoch 1, step [1-9][0-9]*" "$1" || fail "$3: the restarted job did not resume mid-epoch"
  local got
  got=$(digest_of "$1")
  [[ "$got" == "$2" ]] || fail "$3: weights $got, uninterrupted: $2"
}

mlp_ref=$(reference mlp "${mlp[@]}")
echo "uninterrupted MLP: $mlp_ref"

# torchrun restarts every worker when one dies; the new attempt resumes from the newest checkpoint.
if command -v torchrun >/dev/null; then
  cnn_ref=$(reference cnn "${cnn[@]}")
  for model in mlp cnn; do
    if [[ $model == mlp ]]; then flags=("${mlp[@]}" --checkpoint-every 100); ref=$mlp_ref; else
      flags=("${cnn[@]}" --checkpoint-every 16); ref=$cnn_ref; fi
    ck="$dir/$model.torchrun.ckpt"
    DDP_TIMEOUT=20 timeout 300 torchrun --master_port=$((20000 + RANDOM % 20000)) --max_restarts 1 --redirects 1 --tee 1 --nproc_per_node=2 --no_python "$bin" \
      "${common[@]}" "${flags[@]}" --backend gloo --checkpoint "$ck" --resume auto \
      >"$dir/$model.torchrun.log" 2>&1 &
    launcher=$!
    kill_after_checkpoint "$ck" RANK=1 "$launcher"
    wait "$launcher" || fail "$model: torchrun --max_restarts 1 exited non-zero"
    log="$dir/$model.torchrun.log"
    grep -q "no checkpoint at $ck yet; starting fresh" "$log" || fail "$model: the first attempt did not start fresh"
    grep -q "rank 1 ended" "$log" || fail "$model: the first attempt's rank 0 did not name rank 1"
    expect_resumed "$log" "$ref" "$model under torchrun --max_restarts 1"
    echo "PASS: $model: torchrun --max_restarts 1, rank 1 killed, restarted from the newest checkpoint: weights $ref"
  done
else
  echo "SKIPPED: torchrun is not installed (Debian's python3-torch provides it); the Slurm and mpirun cases still run"
fi

# A Slurm requeue: the same job id and store directory, SLURM_RESTART_COUNT from 0 to 1.
ck="$dir/slurm.ckpt"
slurm() {  # RESTARTS: both ranks of one attempt, waiting for them; returns non-zero if any failed
  local pids=() rc=0
  for r in 0 1; do
    env SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_LOCALID=$r SLURM_NTASKS_PER_NODE=2 SLURM_JOB_ID=77 \
      SLURM_RESTART_COUNT="$1" DDP_TIMEOUT=20 DDP_STORE_FILE="$dir/store.77" \
      timeout 300 "$bin" "${common[@]}" "${mlp[@]}" --checkpoint-every 100 --backend gloo --checkpoint "$ck" \
      --resume auto >"$dir/slurm.$1.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}
slurm 0 &
attempt=$!
kill_after_checkpoint "$ck" SLURM_PROCID=1 "$attempt"
wait "$attempt" && fail "the Slurm attempt with rank 1 killed succeeded"
slurm 1 || fail "the requeued Slurm attempt failed"
expect_resumed "$dir/slurm.1.rank0.log" "$mlp_ref" "Slurm requeue"
echo "PASS: a Slurm requeue (SLURM_RESTART_COUNT=1, the same store directory) resumed: weights $mlp_ref"

# A torn newest checkpoint (a copy cut short): the job falls back to the one before and says which it skipped.
truncate -s 100 "$ck"
timeout 300 "$bin" "${common[@]}" "${mlp[@]}" --world-size 2 --checkpoint "$ck" --resume auto \
  >"$dir/torn.log" 2>&1 || fail "the run after a torn checkpoint failed"
grep -q "skipped an unusable checkpoint: .*$ck" "$dir/torn.log" || fail "the torn checkpoint $ck was not named"
grep -q "resumed from $ck.1: " "$dir/torn.log" || fail "did not fall back to $ck.1"
[[ "$(digest_of "$dir/torn.log")" == "$mlp_ref" ]] || fail "the run resumed from $ck.1 does not end with $mlp_ref"
echo "PASS: a torn newest checkpoint is named and skipped; the one before ($ck.1) resumes to weights $mlp_ref"

# An mpirun relaunch, at another world size: 2 ranks, rank 1 killed (mpirun ends the job), then 4.
if command -v mpirun >/dev/null; then
  ck="$dir/mpi.ckpt"
  DDP_TIMEOUT=20 timeout 300 mpirun -n 2 "$bin" "${common[@]}" "${mlp[@]}" --checkpoint-every 100 --backend mpi \
    --checkpoint "$ck" --resume auto >"$dir/mpi.2.log" 2>&1 &
  job=$!
  kill_after_checkpoint "$ck" PMI_RANK=1 "$job"
  wait "$job" && fail "the mpirun job with rank 1 killed succeeded"
  DDP_TIMEOUT=60 timeout 300 mpirun -n 4 "$bin" "${common[@]}" "${mlp[@]}" --checkpoint-every 100 --backend mpi \
    --checkpoint "$ck" --resume auto >"$dir/mpi.4.log" 2>&1 || fail "the mpirun relaunch at 4 ranks failed"
  expect_resumed "$dir/mpi.4.log" "$mlp_ref" "mpirun relaunch at 4 ranks"
  echo "PASS: mpirun -n 2, rank 1 killed; mpirun -n 4 --resume auto: weights $mlp_ref"
fi
