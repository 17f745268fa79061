#!/bin/bash
# usage: warnings_test.sh SOURCE [-DDEFINE | -isystem DIR | -march=... (default native) ...]
# Compiles SOURCE (an example, or a test that instantiates the device or NCCL path) the way a careful user
# builds: -O2 with GCC's common warning set, ddp's headers on -I (not -isystem, as Bazel's `includes` puts
# them, which hides their warnings), third-party headers on -isystem. Passes only if nothing warns, so a
# user's -Werror build of ddp's headers does not break. -O2, not -fsyntax-only: some warnings
# (-Wstringop-overflow, -Waggressive-loop-optimizations) come only from the optimiser.
set -uo pipefail
src="$1"; shift
source "$(dirname "$0")/source_tree.sh"
source_tree_root "$src"
warnings=(-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Woverloaded-virtual)
cxx="${CXX:-g++}"
err="${TEST_TMPDIR:-$(mktemp -d)}/err.txt"
rel="${real#"$root"/}"
cd "$root" || exit 1
"$cxx" -std=c++20 -O2 -DNDEBUG "${warnings[@]}" "${source_tree_includes[@]}" -march=native "$@" -c "$rel" \
  -o /dev/null 2>"$err"
rc=$?
n=$(grep -c 'warning:' "$err")
if [ "$rc" -ne 0 ] || [ "$n" -ne 0 ]; then
  head -c 20000 "$err"
  echo "FAIL: $rel: exit status $rc, $n warning(s) with ${warnings[*]} $*"
  exit 1
fi
echo "PASS: $rel compiles without a warning (${warnings[*]} $*)"
