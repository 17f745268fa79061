#!/bin/bash
# usage: run_example_test.sh BINARY [ARGS...]: runs an example; the test passes when it exits 0.
set -euo pipefail
exec timeout --kill-after=5 "${DDP_EXAMPLE_TIMEOUT:-120}" "$@"
