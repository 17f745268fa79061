#!/bin/bash
# usage: expect_output.sh PATTERN COMMAND...: runs COMMAND; passes if it exits 0 and its output matches PATTERN.
set -uo pipefail
pattern="$1"; shift
out="$("$@" 2>&1)"; rc=$?
echo "$out" | tail -n 30
[[ $rc -eq 0 ]] || { echo "FAIL: exit code $rc"; exit 1; }
grep -Eq "$pattern" <<<"$out" || { echo "FAIL: output does not match /$pattern/"; exit 1; }
echo "PASS: output matches /$pattern/"
