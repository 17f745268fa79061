#!/bin/bash
# cluster_allreduce.sh [RATE] [FLAGS...]: bench/comm/allreduce across 2 namespace hosts (tools/cluster), 1 and 2
# ranks per host, over TCP only (UCX_TLS=tcp,self); RATE (e.g. 1gbit) limits every host's link with tc tbf;
# FLAGS go to allreduce (e.g. --rewrite). Build first: bazel build //bench/comm:allreduce. Needs root.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
rate=()
if [[ $# -gt 0 && "$1" != --* ]]; then
  rate=(--rate "$1")
  shift
fi
for ppn in 1 2; do
  echo "== 2 hosts x $ppn ranks${rate[1]:+, links limited to ${rate[1]}}"
  UCX_TLS=tcp,self tools/cluster/cluster.sh --hosts 2 "${rate[@]}" -- tools/cluster/mpiexec.sh "$ppn" $((2 * ppn)) \
    bazel-bin/bench/comm/allreduce --no-threads --min-bytes=1048576 --max-bytes=64000000 --budget-ms=100 "$@"
done
