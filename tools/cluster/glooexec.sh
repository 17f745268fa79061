#!/bin/bash
# glooexec.sh PPN NP PROGRAM [ARGS...]: inside cluster.sh, runs PROGRAM with NP ranks, PPN per host, across the
# cluster's hosts without MPI, as torchrun or srun would: each rank gets RANK, WORLD_SIZE, LOCAL_RANK,
# LOCAL_WORLD_SIZE, and MASTER_ADDR=h0 / MASTER_PORT=29500 (rank 0 serves the store there; the cluster's
# namespaces are its own, so the port is free). Outputs carry "[rank r] ". Exit status: the first failing
# rank's; once a rank failed the others get DDP_LAUNCH_GRACE seconds (10) to end, then are killed.
set -uo pipefail
ppn="$1"; np="$2"; shift 2
IFS=, read -r -a hosts <<<"${DDP_CLUSTER_HOSTS:?run inside cluster.sh}"
(( np <= ppn * ${#hosts[@]} )) || { echo "glooexec.sh: $np ranks do not fit $ppn per host on ${#hosts[@]} hosts" >&2; exit 2; }
pids=()
trap 'kill -KILL "${pids[@]}" 2>/dev/null' EXIT
for ((r = 0; r < np; r++)); do
  host="${hosts[r / ppn]}"
  vars="RANK=$r WORLD_SIZE=$np LOCAL_RANK=$((r % ppn)) LOCAL_WORLD_SIZE=$ppn MASTER_ADDR=${hosts[0]} MASTER_PORT=29500"
  for v in DDP_TIMEOUT DDP_KILL_RANK DDP_STALL_RANK; do [[ -n "${!v:-}" ]] && vars+=" $v=${!v}"; done
  "$DDP_CLUSTER_LAUNCHER" "$host" env $vars "$@" > >(sed -u "s/^/[rank $r] /") 2>&1 &
  pids+=($!)
done
rc=0
failed_at=""
left=("${pids[@]}")
while ((${#left[@]} > 0)); do
  still=()
  for p in "${left[@]}"; do
    if kill -0 "$p" 2>/dev/null; then still+=("$p"); continue; fi
    wait "$p"
    s=$?
    if ((s != 0 && rc == 0)); then rc=$s; failed_at=$SECONDS; fi
  done
  left=("${still[@]}")
  if [[ -n "$failed_at" ]] && ((${#left[@]} > 0 && SECONDS - failed_at >= ${DDP_LAUNCH_GRACE:-10})); then
    echo "glooexec.sh: a rank failed; ending the others" >&2
    break
  fi
  ((${#left[@]} > 0)) && sleep 0.1
done
exit "$rc"
