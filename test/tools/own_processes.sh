#!/bin/bash
# Sourced by the test scripts that kill or stop one rank of a job they started: which processes are theirs.
# Bazel runs tests side by side, and another test's ranks run the same binary with the same RANK or PMI_RANK in
# their environment, so a process found by its command line is killed only if it descends from the script that
# sources this (its launchers, mpirun's proxies, torchrun's agent and network-namespace hosts all stay children).
#   mine PID          whether PID descends from this script
#   own_pids PATTERN  the pids that pgrep -f PATTERN finds and that descend from this script

mine() {
  local p="$1"
  while ((p > 1)); do
    ((p == $$)) && return 0
    p=$(awk '/^PPid:/ {print $2}' "/proc/$p/status" 2>/dev/null) || return 1
    [[ -n "$p" ]] || return 1
  done
  return 1
}

own_pids() {
  local p
  for p in $(pgrep -f -- "$1" || true); do
    if mine "$p"; then echo "$p"; fi
  done
}
