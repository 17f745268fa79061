#!/bin/bash
# README.md's "What composes" table (between the composition-table markers) must be exactly what
# composition_table prints from kCompositionRules (parallel/composition.hpp). To update it:
#   bazel run //test/parallel:composition_table
set -euo pipefail
table="$1"
readme="README.md"
[ -f "$readme" ] || { echo "FAIL: README.md not in the runfiles"; exit 1; }
got="$(sed -n '/<!-- composition-table -->/,/<!-- \/composition-table -->/p' "$readme" | sed '1d;$d')"
want="$("$table")"
if [ -z "$got" ]; then echo "FAIL: README.md has no <!-- composition-table --> block"; exit 1; fi
if [ "$got" != "$want" ]; then
  echo "FAIL: README's table differs from kCompositionRules:"
  diff <(echo "$want") <(echo "$got") || true
  exit 1
fi
echo "PASS: README's What composes table is kCompositionRules ($(echo "$want" | tail -n +3 | wc -l) rules)"
