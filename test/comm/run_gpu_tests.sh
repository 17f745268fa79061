#!/bin/bash
# Runs the GPU tests on a machine with a CUDA GPU (they are built everywhere by `bazel build //...`; without a
# GPU they skip, or are tagged "manual"): then records what a GPU session should paste into bench/RESULTS.md.
#   1. Kernels<DeviceSpace> on the GPU (cuBLAS, cuDNN, Thrust) against the host kernels  (device_kernels_cuda_test),
#      mixed precision (tf32/bf16/fp16 GEMMs and convolutions, bf16/fp16 training against float; precision_cuda_test)
#      and every autograd op's gradient check on GPU tensors (device_ops_cuda_test; one binary, device_cuda_tests);
#      a bad class id in a device loss, reported at the next host read                       (device_errors_cuda_test)
#   2. the NCCL backend's conformance suite on device buffers, world size 1, its ranks met over MPI and through
#      a file store (no MPI)                                                  (nccl_conformance{,_store}_gpu_test)
#   3. DDP over device tensors on NCCL, world size 1 (and 2 when two GPUs are visible)  (ddp_nccl_gpu_np*_test)
#   4. the main job with --device cuda: ms/step of the BasicNet CNN on one GPU, 2 epochs in each precision; a tf32,
#      bf16 or fp16 run fails the script when its test accuracy is more than 0.3 points from fp32's
#      (tools/gpu/run.sh --judge); then ZeRO-1 and the overlapped update on NCCL, 1 epoch each (fashion_mnist_cuda)
# usage: test/comm/run_gpu_tests.sh [extra bazel args]     (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
nvidia-smi -L || { echo "no GPU visible (nvidia-smi failed)"; exit 1; }
gpus=$(nvidia-smi -L | grep -c '^GPU')
tests=(//test/tensor:device_kernels_cuda_test //test/tensor:precision_cuda_test //test/tensor:device_errors_cuda_test
       //test/autograd:device_ops_cuda_test
       //test/comm:nccl_conformance_gpu_test //test/comm:nccl_conformance_store_gpu_test //test/parallel:ddp_nccl_gpu_np1_test)
if [ "$gpus" -ge 2 ]; then tests+=(//test/parallel:ddp_nccl_gpu_np2_test); fi
# DDP_REQUIRE_GPU=1: a binary that finds no usable GPU fails instead of skipping. LD_LIBRARY_PATH: cuDNN's
# run-time compiled engines and NVRTC, which cuDNN dlopens by name.
bazel test --test_output=all --test_env=DDP_REQUIRE_GPU=1 --test_env=LD_LIBRARY_PATH=/usr/local/cuda/lib64 "$@" "${tests[@]}"

# The main job's step time on one GPU (CNN, AdamW, global batch 64): the per-epoch line prints ms/step. Each
# precision's final test accuracy is judged against fp32's after all four have run.
bazel build "$@" //examples:fashion_mnist_cuda
data="${DDP_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist/}"
judged=0
if [ -d "$data" ]; then
  runs=/tmp/fashion_mnist_cuda.runs; : > "$runs"
  for p in fp32 tf32 bf16 fp16; do
    out=/tmp/fashion_mnist_cuda_$p.txt
    LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout 1200 mpirun -n 1 bazel-bin/examples/fashion_mnist_cuda --device cuda \
      --data-dir "$data" --epochs 2 --model cnn --precision $p | tee "$out"
    grep -E "ms/step|test accuracy" "$out"
    printf '%s\t%s\n' "$out" "--epochs 2 --model cnn --precision $p" >> "$runs"
  done
  tools/gpu/run.sh --judge "$runs" || judged=$?
  for z in "--zero 1" "--overlap-update"; do
    # shellcheck disable=SC2086
    LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout 600 mpirun -n 1 bazel-bin/examples/fashion_mnist_cuda --device cuda \
      --data-dir "$data" --epochs 1 --model cnn $z | grep -E "ms/step|test accuracy"
  done
else
  echo "Fashion-MNIST not found in $data (set DDP_FASHION_MNIST_DIR): step time and accuracies not measured"
fi
echo "GPU tests done on: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)"
exit "$judged"
