#!/bin/bash
# usage: clang_test.sh REPO_FILE THRUST_INCLUDE_DIR
#        clang_test.sh REPO_FILE CCCL_INCLUDE_DIR CUDA_INCLUDE_DIR   (the NCCL backend's unit only)
# ddp with Clang (Debian's clang++-14, which tools/setup.sh installs for the fuzzers) on libstdc++ 12:
#   - the examples and the device training test (Thrust's CPU system) compile without a warning under -Wall
#     -Wextra -Wpedantic -Wshadow (-fsyntax-only: Clang warns from its front end); with a CUDA include
#     directory, the NCCL backend's unit alone does;
#   - 02_equivalence (threads and MPI, DDP with buckets against one process), 00_toy and the host kernels'
#     tests are built at -O1 and run: the equivalence example exits non-zero if DDP's weights drift from the
#     single process's, the kernel tests if a GEMM path or the Winograd convolution leaves its reference.
# Skips, saying so, where clang++-14 is not installed.
set -uo pipefail
source "$(dirname "$0")/source_tree.sh"
source_tree_root "$1"
thrust="${2:?usage: clang_test.sh REPO_FILE THRUST_INCLUDE_DIR [CUDA_INCLUDE_DIR]}"
cuda="${3:-}"
cxx="${CLANGXX:-clang++-14}"
if ! command -v "$cxx" >/dev/null; then
  echo "SKIPPED: $cxx is not installed (bash tools/setup.sh installs it); ddp's Clang build was not checked"
  exit 0
fi
out="${TEST_TMPDIR:-$(mktemp -d)}"
cd "$root" || exit 1
flags=(-std=c++20 -Wall -Wextra -Wpedantic -Wshadow "${source_tree_includes[@]}" -isystem "$thrust")
failed=0
check() {  # check LOG COMMAND...: runs the command; fails on a non-zero exit or any warning in its output
  local log="$1"; shift
  "$@" >"$log" 2>&1
  local rc=$? n
  n=$(grep -c 'warning:' "$log")
  if [ "$rc" -ne 0 ] || [ "$n" -ne 0 ]; then
    head -c 20000 "$log"
    echo "FAIL: exit status $rc, $n warning(s): $*"
    failed=1
  else
    echo "PASS: $*"
  fi
}
if [ -n "$cuda" ]; then
  check "$out/syntax.log" "$cxx" "${flags[@]}" -isystem "$cuda" -fsyntax-only test/comm/nccl_conformance_main.cpp
  [ "$failed" -eq 0 ] && echo "PASS: the NCCL backend compiles with $cxx"
  exit "$failed"
fi
cpu=-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP
units=(examples/01_quickstart.cpp examples/03_wide.cpp examples/05_fashion_mnist.cpp examples/05_fashion_mnist_host.cpp
       examples/06_toy_trainer.cpp examples/09_gpt_quickstart.cpp
       "examples/04_replay.cpp $cpu" "test/nn/device_training_test.cpp $cpu")
for tu in "${units[@]}"; do
  # shellcheck disable=SC2086  # a source and its defines
  check "$out/syntax.log" "$cxx" "${flags[@]}" -fsyntax-only $tu
done
link=(-L/usr/lib/x86_64-linux-gnu -lmpich -L/usr/lib -lgloo -lz -pthread)
check "$out/toy.log" "$cxx" "${flags[@]}" -O1 -march=native examples/00_toy.cpp -o "$out/toy" "${link[@]}"
check "$out/equivalence.log" "$cxx" "${flags[@]}" -O1 -march=native examples/02_equivalence.cpp -o "$out/equivalence" "${link[@]}"
# The hand-vectorised host kernels (GEMM paths, Winograd convolution with DDP_IVDEP loops) against their
# references, as built by Clang.
check "$out/kernels.log" "$cxx" "${flags[@]}" -O1 -march=native test/doctest_main.cpp test/tensor/host_kernels_test.cpp \
  test/tensor/host_winograd_test.cpp -o "$out/kernels" "${link[@]}"
[ -x "$out/toy" ] && check "$out/toy_run.log" timeout 120 "$out/toy"
[ -x "$out/kernels" ] && check "$out/kernels_run.log" timeout 300 "$out/kernels" && tail -n 2 "$out/kernels_run.log"
[ -x "$out/equivalence" ] && check "$out/eq_run.log" timeout 120 "$out/equivalence" --world-size 4 &&
  tail -n 3 "$out/eq_run.log"
if [ -x "$out/equivalence" ] && command -v mpirun >/dev/null; then
  check "$out/eq_mpi.log" timeout 120 mpirun -n 2 "$out/equivalence" --backend mpi && tail -n 2 "$out/eq_mpi.log"
fi
[ "$failed" -eq 0 ] && echo "PASS: ddp builds and runs with $cxx"
exit "$failed"
