#!/bin/bash
# usage: warnings_test.sh SOURCE [-DDEFINE | -isystem DIR | -march=... (default native) ...]
# Compiles SOURCE (an example, or a test that instantiates the device or NCCL path) the way a careful user
# builds: -O2 with GCC's common warning set, ddp's headers on -I (not -isystem, as Bazel's `includes` puts
# them, which hides their warnings), third-party headers on -isystem. Passes only if nothing warns, so a
# user's -Werror build of ddp's headers does not break. -O2, not -fsyntax-only: some warnings
# (-Wstringop-overflow, -Waggressive-loop-optimizations) come only from the optimiser.
set -uo pipefail
src="$1"; shift
# The repository root: the first directory above the source's real path (runfiles are symlinks into the
# source tree) that holds include/ddp/ddp.hpp.
real="$(readlink -f "$src")"
root="$(dirname "$real")"
while [ "$root" != / ] && [ ! -f "$root/include/ddp/ddp.hpp" ]; do root="$(dirname "$root")"; done
[ -f "$root/include/ddp/ddp.hpp" ] || { echo "FAIL: no include/ddp/ddp.hpp above $real"; exit 1; }
warnings=(-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Woverloaded-virtual)
cxx="${CXX:-g++}"
err="${TEST_TMPDIR:-$(mktemp -d)}/err.txt"
rel="${real#"$root"/}"
cd "$root" || exit 1
"$cxx" -std=c++20 -O2 -DNDEBUG "${warnings[@]}" -I include -I . -isystem /usr/include/eigen3 \
  -isystem /usr/include/x86_64-linux-gnu/mpich -isystem /usr/local/cuda/include/cccl -isystem /usr/local/cuda/include \
  -march=native "$@" -c "$rel" -o /dev/null 2>"$err"
rc=$?
n=$(grep -c 'warning:' "$err")
if [ "$rc" -ne 0 ] || [ "$n" -ne 0 ]; then
  head -c 20000 "$err"
  echo "FAIL: $rel: exit status $rc, $n warning(s) with ${warnings[*]} $*"
  exit 1
fi
echo "PASS: $rel compiles without a warning (${warnings[*]} $*)"
