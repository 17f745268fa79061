#!/bin/bash
# usage: expect_failure.sh NP SECONDS PATTERN [--ranks=R1,R2,...] BINARY [ARGS...]
# Runs BINARY under mpirun -n NP (NP = 0: directly, no launcher) and passes if the job fails (non-zero)
# within SECONDS, without being killed by the timeout, and its output matches the extended regex PATTERN
# (e.g. the failing rank's name). With --ranks, PATTERN must match once for each listed rank, with every
# "{rank}" in it replaced by that rank: the same error reported on every rank that can still speak.
set -uo pipefail
np="$1"; limit="$2"; pattern="$3"; shift 3
ranks=()
if [[ "${1:-}" == --ranks=* ]]; then IFS=, read -ra ranks <<<"${1#--ranks=}"; shift; fi
if [[ "$np" == 0 ]]; then launcher=(); else launcher=(mpirun -n "$np"); fi
start=$(date +%s)
out="$(timeout --kill-after=5 "$limit" "${launcher[@]}" "$@" 2>&1)"
rc=$?
echo "$out" | tail -n 20
echo "(the job ended after $(( $(date +%s) - start )) s, exit code $rc)"
if [[ $rc -eq 0 ]]; then echo "FAIL: the job succeeded; a failure was expected"; exit 1; fi
if [[ $rc -eq 124 || $rc -eq 137 ]]; then echo "FAIL: the job hung (killed after ${limit}s)"; exit 1; fi
if [[ ${#ranks[@]} -eq 0 ]]; then
  if ! grep -Eq "$pattern" <<<"$out"; then echo "FAIL: output does not match /$pattern/"; exit 1; fi
else
  for r in "${ranks[@]}"; do
    p="${pattern//\{rank\}/$r}"
    if ! grep -Eq "$p" <<<"$out"; then echo "FAIL: rank $r: output does not match /$p/"; exit 1; fi
  done
fi
echo "PASS: exit code $rc, output matches /$pattern/${ranks:+ for ranks ${ranks[*]}}"
