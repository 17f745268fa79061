#!/bin/bash
# usage: expect_every_rank.sh NP SECONDS PATTERN BINARY [ARGS...]
# Runs BINARY under mpirun -n NP and passes if the job fails (non-zero) within SECONDS, without being killed
# by the timeout, and every rank r in 0..NP-1 printed a line "rank r: ..." matching the extended regex PATTERN:
# the same error on every rank, not only on the one that failed first.
set -uo pipefail
np="$1"; limit="$2"; pattern="$3"; shift 3
out="$(timeout --kill-after=5 "$limit" mpirun -n "$np" "$@" 2>&1)"
rc=$?
echo "$out" | tail -n 40
if [[ $rc -eq 0 ]]; then echo "FAIL: the job succeeded; a failure was expected"; exit 1; fi
if [[ $rc -eq 124 || $rc -eq 137 ]]; then echo "FAIL: the job hung (killed after ${limit}s)"; exit 1; fi
for ((r = 0; r < np; ++r)); do
  if ! grep -Eq "^rank $r: .*($pattern)" <<<"$out"; then
    echo "FAIL: rank $r printed no line matching /$pattern/"
    exit 1
  fi
done
echo "PASS: exit code $rc, all $np ranks report /$pattern/"
