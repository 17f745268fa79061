#!/bin/bash
# usage: gloo_launch.sh NP METHOD BINARY [ARGS...]   Runs NP processes of BINARY on this host as a launcher without
# MPI would: RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, and METHOD "file" (DDP_STORE_FILE in a fresh
# directory, as under srun) or "env" (MASTER_ADDR=127.0.0.1 and a free MASTER_PORT: rank 0 serves the store).
# Output lines carry a "[rank r] " prefix. Exits with the first non-zero status of a rank; once one rank has
# failed the others get DDP_LAUNCH_GRACE seconds (10) to end on their own, then are killed. The whole job gets
# DDP_LAUNCH_TIMEOUT seconds (120).
set -uo pipefail
np="$1" method="$2"
shift 2
dir="$(mktemp -d "${TEST_TMPDIR:-/tmp}/gloo_launch.XXXX")"
trap 'kill -KILL "${pids[@]}" 2>/dev/null; rm -rf "$dir"' EXIT
env_for() {
  echo "RANK=$1 WORLD_SIZE=$np LOCAL_RANK=$1 LOCAL_WORLD_SIZE=$np"
  case "$method" in
    file) echo "DDP_STORE_FILE=$dir/store" ;;
    env) echo "MASTER_ADDR=127.0.0.1 MASTER_PORT=$port" ;;
    *) echo "gloo_launch.sh: METHOD must be file or env, got '$method'" >&2; exit 2 ;;
  esac
}
port=0
# env: a port below Linux's ephemeral range (32768 and up), so no connection's own port takes it; a job that
# loses the draw to another fails at once naming the port ("cannot listen on").
[[ "$method" == env ]] && port=$((20000 + RANDOM % 12000))
pids=()
for ((r = 0; r < np; r++)); do
  vars=$(env_for "$r") || exit 2
  # shellcheck disable=SC2086
  env $vars "$@" > >(sed -u "s/^/[rank $r] /") 2>&1 &
  pids+=($!)
done
rc=0
deadline=$((SECONDS + ${DDP_LAUNCH_TIMEOUT:-120}))
left=("${pids[@]}")
failed_at=""
while ((${#left[@]} > 0)); do
  still=()
  for p in "${left[@]}"; do
    if kill -0 "$p" 2>/dev/null; then
      still+=("$p")
    else
      wait "$p"
      s=$?
      if ((s != 0 && rc == 0)); then rc=$s; failed_at=$SECONDS; fi
    fi
  done
  left=("${still[@]}")
  ((${#left[@]} == 0)) && break
  if ((SECONDS >= deadline)); then echo "gloo_launch.sh: the job has not ended after ${DDP_LAUNCH_TIMEOUT:-120} s" >&2; rc=124; break; fi
  if [[ -n "$failed_at" ]] && ((SECONDS - failed_at >= ${DDP_LAUNCH_GRACE:-10})); then
    echo "gloo_launch.sh: a rank failed; ending the others" >&2
    break
  fi
  sleep 0.1
done
exit "$rc"
