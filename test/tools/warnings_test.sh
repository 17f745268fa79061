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
# GCC 12.1-12.2's AVX-512 intrinsics make their "undefined" vectors by self-initialisation (`__m512 __Y = __Y;`
# in avx512fintrin.h), and once an intrinsic is inlined -Wuninitialized / -Wmaybe-uninitialized report it there
# (GCC bug 105593). With -march=native on an AVX-512 CPU every Eigen kernel shows it, with or without ddp. Those
# warnings, located in the compiler's own *intrin.h and naming `__Y`, are counted apart; any other warning fails.
gcc_bug='include/[a-z0-9_]*intrin\.h:[0-9]+:[0-9]+: warning: .__Y. (is|may be) used uninitialized'
n_all=$(grep -c 'warning:' "$err")
n_bug=$(grep -Ec "$gcc_bug" "$err")
n=$((n_all - n_bug))
if [ "$rc" -ne 0 ] || [ "$n" -ne 0 ]; then
  if [ "$n_bug" -eq 0 ]; then head -c 20000 "$err"; else grep -Ev "$gcc_bug" "$err" | grep -B 8 -A 12 -E 'warning:|error:' | head -c 20000; fi
  echo "FAIL: $rel: exit status $rc, $n warning(s) with ${warnings[*]} $*"
  exit 1
fi
known=""
[ "$n_bug" -ne 0 ] && known=" (and $n_bug from GCC's AVX-512 intrinsics headers, GCC bug 105593, not counted)"
echo "PASS: $rel compiles without a warning (${warnings[*]} $*)$known"
