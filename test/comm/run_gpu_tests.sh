#!/bin/bash
# Runs the NCCL backend's tests on a machine with a GPU (they are tagged "manual" and "gpu", so
# `bazel test //...` skips them): the conformance suite on device buffers, world size 1 with one GPU.
# usage: test/comm/run_gpu_tests.sh [extra bazel args]     (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
nvidia-smi -L || { echo "no GPU visible (nvidia-smi failed)"; exit 1; }
bazel test --test_tag_filters=gpu --test_output=all "$@" //test/comm:nccl_conformance_gpu_test
