#!/bin/bash
# usage: doctest_file.sh BINARY SOURCE [DOCTEST OPTIONS...]
# Runs the doctest cases of one test source compiled into a unity binary (test/tools/defs.bzl), selected by
# doctest's --source-file filter, and fails when none matched: a filter that selects nothing is not a pass.
set -uo pipefail
bin="$1"; src="$2"; shift 2
out="${TEST_TMPDIR:-$(mktemp -d)}/doctest_file.out"
"$bin" "--source-file=*${src}" "$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
[ "$rc" -ne 0 ] && exit "$rc"
grep -qE '^SKIPPED: ' "$out" && exit 0  # the binary cannot run here (a GPU test without a GPU): .ci/run counts it
ran=$(grep -oE 'test cases: *[0-9]+' "$out" | tail -n 1 | grep -oE '[0-9]+$')
if [ -z "$ran" ] || [ "$ran" -eq 0 ]; then
  echo "FAIL: no test case of $src ran in $bin (is the file compiled into it?)"
  exit 1
fi
exit 0
