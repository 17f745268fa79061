#!/bin/bash
# Soak (issue 11): 10,000 MLP steps at world size 2 on the threads backend and under mpirun -n 2, printing RSS
# and mean step time per 1,000 steps; the last line of each run compares the first window with the last.
#   bench/soak.sh [STEPS]      (builds //bench:soak first)
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-10000}"
bazel build -c opt //bench:soak >/dev/null
bin=bazel-bin/bench/soak
echo "== threads, world size 2"
"$bin" --backend threads --world-size 2 --steps "$steps"
echo "== mpi, mpirun -n 2"
mpirun -n 2 "$bin" --backend mpi --steps "$steps"
