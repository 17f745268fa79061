// Device tensors: Kernels<DeviceSpace> and SpaceAllocator<DeviceSpace>, written once over Thrust. Opt-in: include
// this header and depend on //:ddp_device_cpu (Thrust's CPU system, g++) or build with nvcc (Thrust's CUDA
// system, //:ddp_nccl + tools/cuda.bzl). The autograd, layers, optimizers and DDP take Variable<T, DeviceSpace>
// unchanged: nothing above the kernels is written per memory space.
#pragma once

#include "ddp/tensor/device_allocator.hpp"
#include "ddp/tensor/device_blas.hpp"
#include "ddp/tensor/device_conv_kernels.hpp"
#include "ddp/tensor/device_elementwise.hpp"
#include "ddp/tensor/device_image_kernels.hpp"
#include "ddp/tensor/device_loss_kernels.hpp"
#include "ddp/tensor/device_optim_kernels.hpp"
#include "ddp/tensor/device_random_kernels.hpp"
#include "ddp/tensor/device_system.hpp"
#include "ddp/tensor/device_transformer_kernels.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

// The device math primitives, with Kernels<HostSpace>'s signatures and contracts (host_kernels.hpp).
//   Element-wise ops, reductions, softmax/losses, pooling, batch-norm, optimizer updates, and the transformer
//   family (embedding, layer norm, GELU, causal softmax, axis swaps, slices: device_transformer_kernels.hpp):
//   Thrust algorithms (one functor per element, row or channel) on DeviceSystem: GPU threads on CUDA, the host on
//   CPP/OMP/TBB.
//   GEMM: cuBLAS on CUDA; the host GEMM (Eigen) where device memory is host-accessible.
//   Convolution: cuDNN on CUDA (no fused pooling: the op composes it); the host convolution otherwise.
// Determinism: on CPP every kernel is sequential and bitwise reproducible, and equals the host kernels bitwise
// except sums and exp/log/tanh/erf (a few ulps). No kernel uses atomics (the embedding's scatter-add is a gather
// per table element, layer norm's weight gradient a loop per column). On CUDA, deterministic algorithms throughout
// (cuDNN's deterministic ones, picked per geometry by its heuristics, which time nothing; reductions in a fixed
// tree), so a run reproduces on the same GPU, cuDNN and sizes.
// Thread safety: as the host kernels; each host thread gets its own cuBLAS and cuDNN handles.
// Performance on a GPU (bench/RESULTS.md, H100): element-wise kernels use one thread per element; row- and
// channel-wise ones (softmax and layer-norm rows, bias sums, batch-norm statistics) one thread per row, plane or
// channel, which is enough for the classifier heads and channel counts of the examples but not a tuned segmented
// reduction; the embedding's gradient uses one thread per table element, each scanning every id (O(rows·ids·dim):
// fine for a character vocabulary, not for a 50k-token one); dropout masks are drawn on the device (PCG32
// jump-ahead), bitwise the host's.
// Host work per step (device_counters.hpp counts it): after the first step, tensors come from a per-thread cache of
// freed blocks (no allocation); cross_entropy keeps its loss and gradient in device memory and checks its class
// ids in the kernel, reporting a bad one at the next host read (device_errors.hpp). nll_loss and mse_loss still
// return their value to the host (a wait per step), and so does loss.item().
template <>
struct Kernels<DeviceSpace> : DeviceElementwiseKernels,
                              DeviceLossKernels,
                              DeviceBlasKernels,
                              DeviceConvKernels,
                              DeviceImageKernels,
                              DeviceOptimKernels,
                              DeviceRandomKernels,
                              DeviceTransformerKernels {
  using system = DeviceSystem;
};

}  // namespace ddp
