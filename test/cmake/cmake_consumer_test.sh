#!/usr/bin/env bash
# The CMake package, used the two ways consumers do, offline, from a copy of the source tree:
#  1. add_subdirectory(<ddp>)                       -> builds and runs the consumer
#  2. cmake --install <ddp> + find_package(ddp)     -> builds and runs the consumer against the installed copy
#  3. the one-line plain compile from the README    (g++ -std=c++20 -I include -I /usr/include/eigen3 ... -lz -pthread)
# ddp::mpi consumers run under mpirun -n 2 where MPI is found; ddp::nccl consumers are linked where CUDA is.
set -euo pipefail

command -v cmake >/dev/null || { echo "cmake_consumer_test: cmake is not installed (run tools/setup.sh)" >&2; exit 1; }
root="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-}"
[ -f "$root/CMakeLists.txt" ] || root="$(cd "$(dirname "$0")/../.." && pwd)"
work="${TEST_TMPDIR:-$(mktemp -d)}/cmake_consumer"
rm -rf "$work" && mkdir -p "$work"
trap 'status=$?; [ $status -eq 0 ] || echo "cmake_consumer_test: FAILED (logs under $work)" >&2' EXIT

# A plain copy (no Bazel runfile symlinks), as a user's checkout would be.
src="$work/ddp"
mkdir -p "$src"
cp -rL "$root/CMakeLists.txt" "$root/cmake" "$root/include" "$src/"
cp -rL "$root/test/cmake/consumer" "$work/consumer"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
jobs=2

run_consumer() {  # $1: build dir; the rest: configure arguments
  local b="$1"; shift
  cmake "${gen[@]}" -S "$work/consumer" -B "$b" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-O0 "$@" > "$b.configure.log" 2>&1 \
    || { cat "$b.configure.log"; exit 1; }
  cmake --build "$b" -j "$jobs" > "$b.build.log" 2>&1 || { tail -50 "$b.build.log"; exit 1; }
  "$b/train_threads"
  if [ -x "$b/train_mpi" ]; then
    mpirun -n 2 "$b/train_mpi"
  fi
  if [ -x "$b/nccl_link" ]; then
    "$b/nccl_link"
  fi
}

echo "== 1. add_subdirectory"
run_consumer "$work/build-subdir" -DDDP_CONSUME=subdirectory -DDDP_SOURCE_DIR="$src"
grep -q "ddp::mpi ON" "$work/build-subdir.configure.log" && echo "(ddp::mpi exported)"

echo "== 2. cmake --install + find_package(ddp CONFIG)"
cmake "${gen[@]}" -S "$src" -B "$work/build-ddp" > "$work/build-ddp.log" 2>&1 || { cat "$work/build-ddp.log"; exit 1; }
cmake --install "$work/build-ddp" --prefix "$work/prefix" > "$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
test -f "$work/prefix/include/ddp/ddp.hpp" || { echo "headers were not installed" >&2; exit 1; }
test -f "$work/prefix/lib/cmake/ddp/ddpConfig.cmake" || { echo "ddpConfig.cmake was not installed" >&2; exit 1; }
# The installed package must not point back into the source tree.
if grep -rq "$src" "$work/prefix/lib/cmake/ddp"; then echo "installed package refers to the source tree" >&2; exit 1; fi
mv "$src" "$src.moved"  # and the consumer must build without it
run_consumer "$work/build-pkg" -DDDP_CONSUME=package -DCMAKE_PREFIX_PATH="$work/prefix"
mv "$src.moved" "$src"

echo "== 3. a component that was not built is a clear error"
mkdir -p "$work/missing"
cat > "$work/missing/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(missing LANGUAGES CXX)
find_package(ddp CONFIG REQUIRED COMPONENTS no_such_component)
CM
if cmake -S "$work/missing" -B "$work/build-missing" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/missing.log" 2>&1; then
  echo "find_package with an unknown component succeeded" >&2; exit 1
fi
grep -q "without ddp::no_such_component" "$work/missing.log" || { cat "$work/missing.log"; exit 1; }
echo "unknown component rejected, as expected"

echo "== 4. plain g++ (README one-liner)"
g++ -std=c++20 -O0 -I "$src/include" -I /usr/include/eigen3 "$work/consumer/train_threads.cpp" -o "$work/plain" -lz -pthread
"$work/plain"
echo "cmake_consumer_test: all consumers built and ran"
