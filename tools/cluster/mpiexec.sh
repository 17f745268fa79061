#!/bin/bash
# mpiexec.sh PPN NP PROGRAM [ARGS...]: inside cluster.sh, runs PROGRAM with NP ranks, PPN per host, across the
# cluster's hosts (Hydra with ns_rsh.sh as its launcher, control traffic on eth0).
set -uo pipefail
ppn="$1"; np="$2"; shift 2
exec mpiexec -launcher ssh -launcher-exec "${DDP_CLUSTER_LAUNCHER:?run inside cluster.sh}" -iface eth0 \
  -hosts "$DDP_CLUSTER_HOSTS" -ppn "$ppn" -n "$np" "$@"
