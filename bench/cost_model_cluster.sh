#!/bin/bash
# cost_model_cluster.sh [RATE] [MODELS]: bench/cost_model across 2 namespace hosts (tools/cluster), 1 and 2
# ranks per host (world sizes 2 and 4), over TCP only (UCX_TLS=tcp,self); RATE (e.g. 200mbit) limits every
# host's link with tc tbf. MODELS defaults to mlp,cnn,wide without a RATE and mlp,cnn with one (the wide
# model's 400 MB gradient takes seconds per step behind a slow link). Build first: bazel build
# //bench:cost_model. Needs root. UCX's TCP MPI_Finalize can hang after the results are out (docs/cluster.md):
# each run has a time limit.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rate=()
[[ -n "${1:-}" ]] && rate=(--rate "$1")
models="${2:-}"
[[ -z "$models" ]] && models=$([[ -n "${1:-}" ]] && echo mlp,cnn || echo mlp,cnn,wide)
for ppn in 1 2; do
  echo "== 2 hosts x $ppn ranks${1:+, links limited to $1}"
  UCX_TLS=tcp,self timeout 900 tools/cluster/cluster.sh --hosts 2 "${rate[@]}" -- \
    tools/cluster/mpiexec.sh "$ppn" $((2 * ppn)) bazel-bin/bench/cost_model --backend mpi --models "$models"
  echo "== exit status $?"
done
