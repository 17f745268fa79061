#!/bin/bash
# usage: compile_test.sh SOURCE...
# The benchmarks are cc_binary targets tagged manual: `bazel run //bench:<name>` (or bazel build) builds one at
# -O3 when it is asked for, and `bazel test //...` does not spend their -O3 compiles, about a ninth of CI's work,
# on binaries that no test runs. This test keeps every benchmark compiling: g++ -fsyntax-only (C++20, the default
# config's -march=native) parses each source and instantiates every template it uses, which is what a change to
# ddp's API breaks, at about a sixth of the cost of the -O3 build. It does not link; a benchmark's libraries are
# its BUILD deps.
set -uo pipefail
source "$(dirname "$0")/../test/tools/source_tree.sh"
source_tree_root "$1"
cxx="${CXX:-g++}"
err="${TEST_TMPDIR:-$(mktemp -d)}/err.txt"
sources=()
for src in "$@"; do sources+=("$(readlink -f "$src")"); done  # runfiles are symlinks into the source tree
cd "$root" || exit 1
failed=0
for f in "${sources[@]}"; do
  if "$cxx" -std=c++20 -fsyntax-only -march=native -DNDEBUG "${source_tree_includes[@]}" "${f#"$root"/}" 2>"$err"; then
    echo "PASS: ${f#"$root"/} compiles"
  else
    head -c 20000 "$err"
    echo "FAIL: ${f#"$root"/} does not compile"
    failed=1
  fi
done
exit "$failed"
