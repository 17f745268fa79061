#!/bin/bash
# Inside the tarball of tools/gpu/bundle.sh, on a GPU machine: the GPU suite (the same binaries as
# test/comm/run_gpu_tests.sh runs through Bazel) and the main job's step time. Exit status: failed steps.
# usage: run.sh [FASHION_MNIST_DIR]   (without it, or when it holds no data, the main job is skipped)
set -u
here="$(cd "$(dirname "$0")" && pwd)"
data="${1:-${DDP_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist/}}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || { echo "no GPU visible"; exit 1; }
dirs=""
for n in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2 libnvrtc.so.13; do
  p=$(find /usr/local /opt /usr/lib -name "$n" 2>/dev/null | head -n 1)
  if [ -z "$p" ]; then echo "$n: not found on this machine"; exit 1; fi
  echo "$n: $p"
  dirs="$dirs:$(dirname "$p")"
done
export LD_LIBRARY_PATH="$here/lib$dirs" PATH="$here/bin:$PATH" DDP_REQUIRE_GPU=1 UCX_WARN_UNUSED_ENV_VARS=n
failed=0
step() {  # seconds command...: runs it, prints its tail, its status and time
  local limit=$1 t0; shift; t0=$(date +%s%N)
  echo "=== $*"
  timeout "$limit" "$@" 2>&1 | tail -n 30
  local rc=${PIPESTATUS[0]}
  echo "=== rc=$rc in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  [ "$rc" = 0 ] || failed=$((failed + 1))
}
mpi=(mpiexec.hydra -launcher fork -n 1)  # one rank: one GPU
step 600 "$here/bin/device_cuda_tests"  # device_kernels_test.cpp and device_ops_test.cpp, one binary
step 120 "${mpi[@]}" "$here/bin/nccl_conformance" --require-gpu
step 120 env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 "$here/bin/nccl_conformance" --rendezvous --require-gpu  # no MPI
step 120 "${mpi[@]}" "$here/bin/ddp_nccl_main" --require-gpu
if [ -e "$data/train-images-idx3-ubyte.gz" ]; then
  step 300 "${mpi[@]}" "$here/bin/fashion_mnist_cuda" --device cuda --data-dir "$data" --epochs 2 --model cnn
  step 120 "${mpi[@]}" "$here/bin/fashion_mnist_cuda" --device cuda --data-dir "$data" --epochs 1 --model mlp
  # Issue 42: mixed precision, 2 epochs each (test accuracy within 0.3 points of fp32's), and the step table.
  for p in bf16 fp16; do
    for m in cnn mlp; do
      step 300 "${mpi[@]}" "$here/bin/fashion_mnist_cuda" --device cuda --data-dir "$data" --epochs 2 --model $m \
        --precision $p
    done
  done
  # --loss-every 50: the steps between reads have no host wait in them (static_graph, asynchronous batch uploads);
  # with 1 the loss is read every step, as before.
  for p in fp32 bf16; do
    for b in 64 256; do
      for m in cnn mlp; do
        for le in 1 50; do
          step 120 "${mpi[@]}" "$here/bin/fashion_mnist_cuda" --device cuda --data-dir "$data" --epochs 1 --model $m \
            --batch-size $b --precision $p --loss-every $le
        done
      done
    done
  done
else
  echo "Fashion-MNIST not found in $data: the main job's step time is not measured"
fi
# PyTorch on the same GPU, like for like (where this machine has it): eager fp32 and autocast bf16, and CUDA graphs.
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  for args in "" "--precision bf16" "--cuda-graph" "--precision bf16 --cuda-graph"; do
    # shellcheck disable=SC2086
    step 600 python3 "$here/torch_step.py" --deterministic $args
  done
else
  echo "PyTorch with CUDA not found: the PyTorch side of the step table is not measured"
fi
echo "GPU suite: $failed failed step(s) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)"
exit "$failed"
