#!/bin/bash
# usage: bench/ddp_step_backends.sh [ROUNDS] [MODELS]   (after: bazel build //bench:ddp_step)
# bench/ddp_step at world size 2 on the threads backend, under mpirun (MPI) and as two processes over Gloo (rank 0
# serving the store on a loopback port), interleaved A B C per round (default 3 rounds, models wide,cnn), so the
# backends are compared in one run on the same host state. Prints each run's model lines with the backend.
set -euo pipefail
rounds="${1:-3}"
models="${2:-wide,cnn}"
bin="$(cd "$(dirname "$0")/.." && pwd)/bazel-bin/bench/ddp_step"
[[ -x "$bin" ]] || { echo "build it first: bazel build //bench:ddp_step" >&2; exit 2; }
run() {  # BACKEND: one run, model lines prefixed with the backend
  local backend="$1" port=$((20000 + RANDOM % 12000))
  case "$backend" in
    threads) "$bin" --world-size 2 --models "$models" ;;
    mpi) mpirun -n 2 "$bin" --backend mpi --models "$models" ;;
    gloo)
      RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        "$bin" --backend gloo --models "$models" >/dev/null &
      RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        "$bin" --backend gloo --models "$models"
      wait
      ;;
  esac | grep -E "ws=2" | sed "s/^/$backend  /"
}
echo "ddp_step_backends: $(date -u +%F), $(nproc) cores, $rounds rounds, models $models"
for ((i = 1; i <= rounds; i++)); do
  for b in threads mpi gloo; do run "$b"; done
done
