#!/bin/bash
# usage: fuzz_test.sh SECONDS TARGET
# One libFuzzer target (test/fuzz/TARGET_fuzz.cpp) fuzzed for SECONDS under `bazel test //...` by tools/fuzz.sh
# (clang++-14, -fsanitize=fuzzer,address,undefined), from its seed corpus (test/fuzz/corpus/TARGET). Fails when an
# input crashes the parser; the input is kept in the test's undeclared outputs
# (bazel-testlogs/test/fuzz/TARGET_fuzz_test/test.outputs/) to be committed under test/fuzz/regressions/TARGET,
# where //test/fuzz:regressions_test replays it with gcc for good. Skips, saying so, without clang++-14 and
# libFuzzer (tools/setup.sh installs both).
set -uo pipefail
secs="$1"
target="$2"
cxx="${CXX:-clang++-14}"
if ! command -v "$cxx" >/dev/null; then
  echo "SKIPPED: $cxx is not installed (bash tools/setup.sh installs clang-14 and libfuzzer-14-dev); $target was not fuzzed"
  exit 0
fi
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
  "$cxx" -x c++ -fsanitize=fuzzer - -o "${TEST_TMPDIR:-/tmp}/probe" 2>/dev/null; then
  echo "SKIPPED: $cxx cannot link -fsanitize=fuzzer (libfuzzer-14-dev missing; bash tools/setup.sh installs it)"
  exit 0
fi
tool="tools/fuzz.sh"
[ -f "$tool" ] || tool="$(dirname "$0")/../../tools/fuzz.sh"
out="${TEST_UNDECLARED_OUTPUTS_DIR:-${TEST_TMPDIR:-/tmp}}"
FUZZ_OUT="${TEST_TMPDIR:-/tmp}/fuzz" FUZZ_REGRESSIONS="$out/regressions" bash "$tool" "$secs" "$target"
