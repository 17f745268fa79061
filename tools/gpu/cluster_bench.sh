#!/bin/bash
# Inside the tarball of tools/gpu/bundle.sh: issue 13's namespace-host rows of the cost model on that machine's
# CPUs. tools/cluster's scripts (cluster/) with Debian's iproute2 (net/: ip and tc, each run by the dynamic
# loader with its own libraries, so nothing it starts inherits them) make 2 or 4 "hosts" as network namespaces;
# bench/cost_model runs across them over TCP (UCX_TLS=tcp,self): 2 hosts x 1 and x 2 ranks and 4 hosts x 1
# (world sizes 2 and 4) without a limit, then behind 200 Mbit/s (the mlp, about 100 s per run there: the calibration
# sends 64 MiB at 24 MB/s; the cnn takes minutes per run). The whole run takes about 6 minutes on a 16-core host.
# Needs root. Exit status: failed steps.
# usage: [DEADLINE=S] cluster_bench.sh [ROUNDS]   (ROUNDS: repeats of the rows without a limit, default 1;
# DEADLINE: seconds for the whole run, default 600; steps that would start later are skipped)
set -u
here="$(cd "$(dirname "$0")" && pwd)"
rounds="${1:-1}"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PATH="$here/net/bin:$here/bin:$PATH"
export UCX_WARN_UNUSED_ENV_VARS=n UCX_TLS=tcp,self
source "$here/step.sh"
row() {  # seconds hosts ranks-per-host rate("" for none) models
  local limit=$1 hosts=$2 ppn=$3 rate=$4 models=$5 r=()
  [ -n "$rate" ] && r=(--rate "$rate")
  echo "##### $hosts hosts x $ppn ranks, ${rate:-no limit}, $models"
  step "$limit" "$here/cluster/cluster.sh" --hosts "$hosts" "${r[@]}" -- \
    "$here/cluster/mpiexec.sh" "$ppn" $((hosts * ppn)) "$here/bin/cost_model" --backend mpi --models "$models"
}
echo "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(uname -r), $(date -u +%FT%TZ)"
ip -V || { echo "cluster_bench.sh: the carried ip does not run here" >&2; exit 1; }
for r in $(seq "$rounds"); do
  row 200 2 2 "" mlp,cnn,wide
  row 150 2 1 "" mlp,cnn,wide
  row 200 4 1 "" mlp,cnn,wide
done
row 150 2 2 200mbit mlp
row 150 2 1 200mbit mlp
echo "cluster_bench.sh: $failed failed step(s), $(( $(date +%s) - t00 )) s"
exit "$failed"
