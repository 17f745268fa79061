#!/usr/bin/env bash
# Installs everything ddp needs, from Debian's apt only. Idempotent: re-running is a fast no-op.
set -euo pipefail

PKGS=(
  bazel-bootstrap      # Bazel 4.2.3 (the /usr/bin/bazel wrapper runs bazel-4)
  g++                  # C++20 compiler (g++ 12)
  libeigen3-dev        # host tensor math
  mpich libmpich-dev   # MPI backend and mpirun
  libgloo-dev          # Gloo backend (TCP collectives without MPI; //:ddp_gloo)
  python3-torch        # torchrun, for //test/train:fashion_mnist_torchrun_test (the project never imports it)
  libopenblas-dev libopenblas0-pthread  # //:ddp_openblas (the GPT job's GEMMs), and PyTorch's BLAS in bench/ (else netlib's)
  doctest-dev          # unit tests
  zlib1g-dev           # gzip IDX reader
  nlohmann-json3-dev   # JSON (fixture meta.json, trace files)
  dataset-fashion-mnist  # the main job's data under /usr/share/datasets/fashion-mnist
  clang-format         # //test/tools:format_test (the tree follows .clang-format)
  clang-14             # tools/fuzz.sh builds the fuzzers with clang++-14
  libfuzzer-14-dev     # tools/fuzz.sh: libFuzzer for clang++-14 -fsanitize=fuzzer (the IDX and checkpoint fuzzers)
  cmake                # the CMake package test (test/cmake): add_subdirectory and find_package consumers
  iproute2             # test/cluster: network namespaces and veth links (ip netns) for the cluster tests
  libthrust-dev libcub-dev  # Thrust 1.17 and CUB: g++'s device tensors (Thrust's CPU systems; tools/thrust_repo.bzl)
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# CUDA is optional (tools/cuda_repo.bzl): where the toolkit is found (${DDP_CUDA_PATH:-/usr/local/cuda}) every
# target builds; where it is not, the targets that need nvcc, NCCL, cuBLAS or cuDNN are skipped by `bazel build
# //...` and `bazel test //...`. Either way g++ builds device tensors (Thrust's CPU systems) on Debian's Thrust.
cuda="${DDP_CUDA_PATH:-/usr/local/cuda}"
if [ -x "$cuda/bin/nvcc" ] && [ -d "$cuda/include/cccl" ]; then
  echo "setup: CUDA found at $cuda ($("$cuda/bin/nvcc" --version | tail -1)): every target builds"
else
  echo "setup: no CUDA toolkit at $cuda: device tensors use Debian's Thrust (CPU systems); GPU/NCCL targets are skipped"
fi
