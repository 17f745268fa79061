#!/bin/bash
# usage: mpirun_test.sh NP BINARY [ARGS...]   Runs BINARY under MPICH's mpirun with NP ranks.
# A hung job is killed after DDP_MPIRUN_TIMEOUT seconds (default 120) so a test never hangs CI.
set -euo pipefail
np="$1"; shift
exec timeout --kill-after=5 "${DDP_MPIRUN_TIMEOUT:-120}" mpirun -n "$np" "$@"
