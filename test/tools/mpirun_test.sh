#!/bin/bash
# usage: mpirun_test.sh NP BINARY [ARGS...]   Runs BINARY under MPICH's mpirun with NP ranks.
# A job that has not ended after DDP_MPIRUN_TIMEOUT seconds (default 120, and under Bazel at most 15 s less than
# the test's own timeout, $TEST_TIMEOUT) is a hang: this prints what every rank is doing (each thread's
# system call from /proc and, where gdb is installed, each thread's stack), then kills the job and exits 124.
# So a hang in CI leaves its evidence in the test log, instead of Bazel's bare "Test timed out".
set -uo pipefail
np="$1"; shift
limit="${DDP_MPIRUN_TIMEOUT:-120}"
if [[ -z "${DDP_MPIRUN_TIMEOUT:-}" && "${TEST_TIMEOUT:-0}" -gt 30 && $((TEST_TIMEOUT - 15)) -lt "$limit" ]]; then
  limit=$((TEST_TIMEOUT - 15))
fi
mpirun -n "$np" "$@" &
job=$!
# A wall-clock deadline, not a count of 0.1 s sleeps: on a loaded host each sleep and `kill -0` runs late, and
# a count of 10 * limit ticks ran past Bazel's own timeout (a CI run's hang left only "Test timed out").
deadline=$((SECONDS + limit))
while ((SECONDS < deadline)); do
  if ! kill -0 "$job" 2>/dev/null; then
    wait "$job"
    exit $?
  fi
  sleep 0.1
done
if ! kill -0 "$job" 2>/dev/null; then  # it ended at the deadline
  wait "$job"
  exit $?
fi

descendants() {  # every process below $1
  local child
  for child in $(pgrep -P "$1"); do
    echo "$child"
    descendants "$child"
  done
}
echo "mpirun_test.sh: mpirun -n $np $* has not ended after $limit s; what its processes are doing:" >&2
ranks=()
for p in $(descendants "$job"); do
  comm=$(cat "/proc/$p/comm" 2>/dev/null) || continue
  echo "  pid $p ($comm):" >&2
  for t in /proc/"$p"/task/*; do
    echo "    thread ${t##*/} $(cat "$t/comm" 2>/dev/null): syscall $(cut -d' ' -f1-2 "$t/syscall" 2>/dev/null)" >&2
  done
  [[ "$comm" == hydra_pmi_proxy || "$comm" == mpiexec* ]] || ranks+=("$p")
done
if command -v gdb >/dev/null; then
  dumps=()
  for p in "${ranks[@]}"; do  # in parallel: the dump must end before Bazel's own timeout
    timeout 10 gdb -q -batch -p "$p" -ex "thread apply all bt 16" 2>/dev/null |
      grep -E '^(#|Thread)' | sed "s/^/  [pid $p] /" >"/tmp/mpirun_test.$$.$p" &
    dumps+=($!)
  done
  wait "${dumps[@]}" 2>/dev/null
  for p in "${ranks[@]}"; do
    cat "/tmp/mpirun_test.$$.$p" >&2
    rm -f "/tmp/mpirun_test.$$.$p"
  done
fi
kill -TERM "$job" 2>/dev/null
sleep 2
kill -KILL "$job" "${ranks[@]}" 2>/dev/null
wait "$job" 2>/dev/null
exit 124
