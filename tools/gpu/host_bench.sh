#!/bin/bash
# Inside the tarball of tools/gpu/bundle.sh: issue 13's one-host measurements on that machine's CPUs (a second
# host beside this project's 2-vCPU VM), in this order: the cache-line round trip, the wide model's DDP step on
# threads against MPI, the cost model at 2 and 4 ranks, and bench/comm/allreduce at world size 2 and 4 (default
# placement and bound to cores; 8 ranks where the machine has 8 CPUs). Everything in one run, so that the ratios
# compare columns of the same hour. Exit status: failed steps.
# usage: [DEADLINE=S] host_bench.sh [ROUNDS]   (ROUNDS: repeats of the step pairs and of the world-size-2
# all-reduce; default 3. DEADLINE: seconds for the whole run, default 600; steps that would start later are skipped)
set -u
here="$(cd "$(dirname "$0")" && pwd)"
rounds="${1:-3}"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PATH="$here/bin:$PATH"
export UCX_WARN_UNUSED_ENV_VARS=n
source "$here/step.sh"
h=(mpiexec.hydra -launcher fork)  # every rank on this machine
b=(-bind-to core)
echo "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(uname -r), $(date -u +%FT%TZ)"
step 30 "$here/bin/core_pingpong" 0 1
# The step and the cost model first: they take longest to set up on a lent machine and are what the
# all-reduce repeats cannot stand in for.
for r in $(seq "$rounds"); do
  step 90 "$here/bin/ddp_step" --models wide
  step 90 "${h[@]}" "${b[@]}" -n 2 "$here/bin/ddp_step" --backend mpi --models wide
done
step 90 "${h[@]}" -n 2 "$here/bin/ddp_step" --backend mpi --models wide
step 150 "${h[@]}" "${b[@]}" -n 2 "$here/bin/cost_model" --backend mpi
step 150 "${h[@]}" "${b[@]}" -n 4 "$here/bin/cost_model" --backend mpi
step 120 "$here/bin/cost_model" --world-size 2
step 120 "$here/bin/cost_model" --world-size 4
ar=(--no-threads --rewrite --budget-ms=800 --min-bytes=65536 --max-bytes=67108864)
for r in $(seq "$rounds"); do
  step 60 "${h[@]}" -n 2 "$here/bin/allreduce" "${ar[@]}"
  step 60 "${h[@]}" "${b[@]}" -n 2 "$here/bin/allreduce" "${ar[@]}"
done
step 90 "${h[@]}" "${b[@]}" -n 4 "$here/bin/allreduce" "${ar[@]}"
[ "$(nproc)" -ge 8 ] && step 90 "${h[@]}" "${b[@]}" -n 8 "$here/bin/allreduce" "${ar[@]}"
step 90 "${h[@]}" "${b[@]}" -n 2 "$here/bin/allreduce" "${ar[@]:1}"  # with the threads backend's columns
step 30 "$here/bin/core_pingpong" 0 1
echo "host bench: $failed failed step(s)"
exit "$failed"
