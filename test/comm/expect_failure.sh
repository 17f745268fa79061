#!/bin/bash
# usage: expect_failure.sh NP SECONDS PATTERN BINARY [ARGS...]
# Runs BINARY under mpirun -n NP (NP = 0: directly, no launcher) and passes if the job fails (non-zero)
# within SECONDS, without being killed by the timeout, and its output matches the extended regex PATTERN
# (e.g. the failing rank's name).
set -uo pipefail
np="$1"; limit="$2"; pattern="$3"; shift 3
if [[ "$np" == 0 ]]; then launcher=(); else launcher=(mpirun -n "$np"); fi
out="$(timeout --kill-after=5 "$limit" "${launcher[@]}" "$@" 2>&1)"
rc=$?
echo "$out" | tail -n 20
if [[ $rc -eq 0 ]]; then echo "FAIL: the job succeeded; a failure was expected"; exit 1; fi
if [[ $rc -eq 124 || $rc -eq 137 ]]; then echo "FAIL: the job hung (killed after ${limit}s)"; exit 1; fi
if ! grep -Eq "$pattern" <<<"$out"; then echo "FAIL: output does not match /$pattern/"; exit 1; fi
echo "PASS: exit code $rc, output matches /$pattern/"
