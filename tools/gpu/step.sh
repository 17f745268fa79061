# Sourced by host_bench.sh and cluster_bench.sh (inside the tarball of tools/gpu/bundle.sh): `step SECONDS
# COMMAND...` runs COMMAND within what is left of DEADLINE (seconds for the whole run, default 600; a step that
# would start with under 20 s left is skipped), prints its output, status and time, and counts failures in
# `failed`.
failed=0
t00=$(date +%s); deadline="${DEADLINE:-600}"
step() {
  local limit=$1 t0 left rc; shift; t0=$(date +%s%N); left=$(( deadline - ($(date +%s) - t00) ))
  if [ "$left" -lt 20 ]; then echo "=== skipped (DEADLINE): $*"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== $*"
  timeout -k 5 "$limit" "$@" 2>&1
  rc=$?
  echo "=== rc=$rc in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  [ "$rc" = 0 ] || failed=$((failed + 1))
}
