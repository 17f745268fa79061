#!/bin/bash
# usage: cluster_test.sh COMMAND [ARGS...]
# Runs COMMAND (which itself calls tools/cluster/cluster.sh) if a namespace cluster can be made here; else
# prints SKIPPED with the reason and passes. A hung run gets SIGTERM after DDP_CLUSTER_TEST_TIMEOUT s (50),
# before Bazel's own timeout, so cluster.sh still tears its namespaces down.
set -uo pipefail
# MPI between hosts goes over TCP only (cluster.sh's UCX_TLS=tcp,self). UCX's TCP transport used to hang in
# MPI_Finalize now and then (openucx/ucx issue 8738); MpiSession's barrier and quiet period before
# MPI_Finalize avoid it (MpiSessionOptions in include/ddp/comm/mpi/session.hpp; docs/cluster.md).
export UCX_TLS=tcp,self  # the tests are about TCP between hosts, whatever the caller set
probe="$(tools/cluster/cluster.sh --hosts 2 -- true 2>&1)"
rc=$?
if [[ $rc -eq 77 ]]; then
  echo "SKIPPED: ${probe#cluster.sh: } (these tests need root and network namespaces)"
  exit 0
fi
if [[ $rc -ne 0 ]]; then echo "FAIL: the cluster probe failed (exit $rc): $probe"; exit 1; fi
exec timeout --kill-after=5 "${DDP_CLUSTER_TEST_TIMEOUT:-50}" "$@"
