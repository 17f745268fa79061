#!/bin/bash
# usage: compile_fail_test.sh SOURCE DEFINE PATTERN [EXTRA_INCLUDE_DIRS or -FLAGS...]
# Compiles SOURCE with -DDEFINE and passes only if compilation fails with a diagnostic matching PATTERN,
# proving a misuse is a compile error with an actionable message (and that SOURCE compiles without DEFINE).
set -uo pipefail
src="$1"; define="$2"; pattern="$3"; shift 3
# The repository root comes from the source's real path (runfiles are symlinks into the source tree);
# extra include directories (CUDA, MPI) follow as arguments; arguments starting with '-' (-DTHRUST_DEVICE_SYSTEM=...,
# -isystem DIR) are passed to the compiler as they are.
root="$(cd "$(dirname "$(readlink -f "$src")")/../.." && pwd)"
incs=("-I$root/include" "-I$root")
while [ $# -gt 0 ]; do
  case "$1" in
    -isystem) incs+=("-isystem" "$2"); shift 2 ;;
    -*) incs+=("$1"); shift ;;
    *) incs+=("-I$1"); shift ;;
  esac
done
cxx="${CXX:-g++}"
if ! "$cxx" -std=c++20 -fsyntax-only "${incs[@]}" "$src" 2>err_ok.txt; then
  cat err_ok.txt; echo "FAIL: $src does not compile even without -D$define"; exit 1
fi
# -Wfatal-errors: the first error ends the compile. The expected diagnostic is that first error (a static_assert
# or a concept's requires-clause at the misuse); the rest of the instantiation would only cost time.
if "$cxx" -std=c++20 -fsyntax-only -Wfatal-errors "${incs[@]}" "-D$define" "$src" 2>err.txt; then
  echo "FAIL: $src compiled with -D$define; expected a compile error"; exit 1
fi
if ! grep -Eq "$pattern" err.txt; then
  grep -E "error" err.txt | head -n 20; echo "FAIL: no diagnostic matches /$pattern/"; exit 1
fi
grep -Eo "static assertion failed: .*" err.txt | head -n 1
echo "PASS: -D$define fails to compile with /$pattern/"
