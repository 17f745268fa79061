#!/bin/bash
# usage: on_rank.sh RANK VAR=VALUE... -- BINARY [ARGS...]
# Run by mpirun on every rank: the rank whose MPI launcher says it is RANK (PMI_RANK under MPICH/Hydra,
# OMPI_COMM_WORLD_RANK under Open MPI) exports the VAR=VALUE settings; then every rank execs BINARY.
# Gives one rank of a job a launch environment of its own (e.g. stale torchrun variables).
set -euo pipefail
target="$1"; shift
vars=()
while [[ $# -gt 0 && "$1" != "--" ]]; do vars+=("$1"); shift; done
if [[ $# -eq 0 ]]; then echo "on_rank.sh: missing -- BINARY" >&2; exit 2; fi
shift
me="${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-}}"
if [[ "$me" == "$target" ]]; then
  for v in "${vars[@]}"; do export "${v?}"; done
fi
exec "$@"
