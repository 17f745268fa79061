#!/bin/bash
# usage: without_gpu.sh COMMAND [ARGS...]
# For tests of what happens on a machine without a GPU (a clear error instead of a hang or a crash): where a
# GPU is present that path cannot be taken, so this prints "SKIPPED: <why>" and passes (.ci/run counts it as
# skipped); otherwise it runs COMMAND.
set -uo pipefail
if [ -e /dev/nvidia0 ] || { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }; then
  echo "SKIPPED: this machine has a GPU ($(nvidia-smi -L 2>/dev/null | head -n 1)); the no-GPU error path was not exercised"
  exit 0
fi
exec "$@"
