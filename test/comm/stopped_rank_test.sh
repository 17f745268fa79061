#!/bin/bash
# usage: stopped_rank_test.sh NP TIMEOUT BINARY [ARGS...]
# Issue 11's acceptance check, as a user would meet it: start `mpirun -n NP BINARY --backend mpi --timeout
# TIMEOUT ARGS` (a training job), stop rank 1 with kill -STOP once it trains, and require that the whole job
# ends by itself within 30 s of the stop, non-zero, with every other rank's error naming the operation and
# rank 1 as the rank that did not arrive.
set -uo pipefail
source "${TEST_SRCDIR:-$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../..}/${TEST_SRCDIR:+$TEST_WORKSPACE/}test/tools/own_processes.sh"
np="$1"; limit="$2"; binary="$3"; shift 3
log="$(mktemp)"
trap 'rm -f "$log"; [[ -n "${job:-}" ]] && kill -KILL -- -"$job" 2>/dev/null' EXIT
setsid mpirun -n "$np" "$binary" --backend mpi --timeout "$limit" "$@" >"$log" 2>&1 &
job=$!
# Rank 1: the process of this binary whose environment says PMI_RANK=1 (Hydra's variable).
victim=""
for _ in $(seq 1 300); do
  for pid in $(own_pids "$(basename "$binary")"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'PMI_RANK=1'; then victim=$pid; fi
  done
  [[ -n "$victim" ]] && break
  sleep 0.1
done
if [[ -z "$victim" ]]; then echo "FAIL: rank 1's process did not start"; cat "$log"; exit 1; fi
# Let it set up and train, so the stop hits the training loop's collectives (a stop during MPI's own start-up is
# outside ddp's deadlines): wait for rank 0's first epoch line, which follows collectives every rank took. (A fixed
# 2 s sleep stopped rank 1 before it trained on a loaded CI host: the job then sat in start-up until Bazel's timeout.)
for _ in $(seq 1 300); do
  grep -q '^epoch ' "$log" && break
  sleep 0.1
done
grep -q '^epoch ' "$log" || { echo "FAIL: the job printed no epoch line within 30 s"; cat "$log"; exit 1; }
kill -STOP "$victim"
stopped=$(date +%s.%N)
echo "stopped rank 1 (pid $victim)"
for _ in $(seq 1 300); do
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$job" 2>/dev/null; then  # still running 30 s after the stop: say so rather than sit out Bazel's timeout
  kill -CONT "$victim" 2>/dev/null
  echo "FAIL: the job did not end within 30 s of the stop"; tail -n 20 "$log"; exit 1
fi
wait "$job"; rc=$?
took=$(echo "$(date +%s.%N) - $stopped" | bc)
kill -CONT "$victim" 2>/dev/null
job=""
tail -n 20 "$log"
echo "(the job ended ${took} s after the stop, exit code $rc)"
if (( $(echo "$took >= 30" | bc) )); then echo "FAIL: the job did not end within 30 s of the stop"; exit 1; fi
if [[ $rc -eq 0 ]]; then echo "FAIL: the job succeeded"; exit 1; fi
for r in $(seq 0 $((np - 1))); do
  [[ $r == 1 ]] && continue
  if ! grep -Eq "ddp: rank $r of $np failed: ddp mpi: [a-z_]+ #[0-9]+.* on rank $r of $np timed out after $limit s: rank 1 did not arrive" "$log"; then
    echo "FAIL: rank $r did not report the timeout naming the operation and rank 1"; exit 1
  fi
done
echo "PASS"
