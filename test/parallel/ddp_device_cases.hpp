// DDP scenarios over device tensors, written once over any Communicator that accepts them: run in doctest on
// the threads backend (CPU device system, ddp_device_test.cpp) and under mpirun on NCCL (GPU, ddp_nccl_main.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/tensor/device.hpp"
#include "test/parallel/ddp_cases.hpp"

namespace ddp::test::device {

using Dev = DeviceSpace;

template <MemorySpace S>
using Mlp = nn::Sequential<nn::Named<nn::basic_linear<float, S>>, nn::basic_relu<float, S>,
                           nn::Named<nn::basic_linear<float, S>>>;

template <MemorySpace S>
Mlp<S> make_mlp(std::int64_t in, std::int64_t hidden, std::int64_t out, std::uint64_t seed) {
  Generator g(seed);
  return Mlp<S>(nn::named("fc1", nn::basic_linear<float, S>(in, hidden, g)), nn::basic_relu<float, S>(),
                nn::named("fc2", nn::basic_linear<float, S>(hidden, out, g)));
}

template <MemorySpace S>
std::vector<float> host_values(Tensor<float, S> const& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  Kernels<S>::to_host(t.numel(), t.data(), v.data());
  return v;
}

// Parameters in registration order, on the host.
template <MemorySpace S>
std::vector<float> weights(nn::ParameterArena<float, S> const& a) {
  std::vector<float> w;
  for (auto const& e : a.entries()) {
    auto v = host_values(e.var.value());
    w.insert(w.end(), v.begin(), v.end());
  }
  return w;
}

// max |a - b| / max(1, max |b|); infinity when the sizes differ.
inline double rel_diff(std::vector<float> const& a, std::vector<float> const& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, maxw = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, double(std::abs(a[i] - b[i])));
    maxw = std::max(maxw, double(std::abs(b[i])));
  }
  return diff / std::max(1.0, maxw);
}

// One process on the global batch, on host tensors: the reference every device run is compared with.
inline std::vector<float> host_reference(Data const& data, std::int64_t global_batch, int steps) {
  auto ref = make_mlp<HostSpace>(8, 32, 4, 1);
  nn::ParameterArena<float> p(ref);
  optim::SGD opt(p, {.lr = 0.05, .momentum = 0.9});
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    backward(
        mse_loss(ref(Var(rows(data.x, s * global_batch, global_batch))), rows(data.y, s * global_batch, global_batch)));
    opt.step();
  }
  return weights(p);
}

// N ranks, each on its B/N rows, training a device model under DDP (SGD with momentum). Returns the weights.
template <AsyncCommunicator C>
std::vector<float> device_ddp(C& comm, Data const& data, std::int64_t global_batch, int steps,
                              BucketConfig buckets = {}, DdpOptions opts = {}) {
  int const n = comm.world_size(), r = comm.rank();
  std::int64_t const local = global_batch / n;
  auto model = make_mlp<Dev>(8, 32, 4, 1 + static_cast<std::uint64_t>(r));  // rank 0's weights are broadcast
  DistributedDataParallel ddp(model, comm, opts, {.bucketer = SizeCapped{buckets}});
  optim::basic_sgd<float, Dev> opt(ddp.parameters(), {.lr = 0.05, .momentum = 0.9});
  for (int s = 0; s < steps; ++s) {
    std::int64_t const base = s * global_batch + r * local;
    opt.zero_grad();
    auto x = to_space<Dev>(rows(data.x, base, local));
    auto y = to_space<Dev>(rows(data.y, base, local));
    backward(mse_loss(ddp(Variable<float, Dev>(x)), y));
    opt.step();
  }
  return weights(ddp.parameters());
}

// A small CNN (conv 1→4 3×3 pad 1, ReLU, max-pool 2, flatten, linear 64→3) on 8×8 images with cross-entropy:
// device DDP over `comm` against one host process on the global batch; returns the relative weight difference.
template <AsyncCommunicator C>
double cnn_equivalence(C& comm, std::int64_t global_batch = 8, int steps = 10) {
  auto build = []<MemorySpace S>(std::type_identity<S>) {
    Generator g(3);
    nn::AnySequential<float, S> m;
    m.push_back("conv", nn::basic_conv2d<float, S>(1, 4, 3, g, {.padding = 1})).push_back(nn::basic_relu<float, S>());
    m.push_back(nn::basic_max_pool2d<float, S>(2)).push_back(nn::basic_flatten<float, S>());
    m.push_back("fc", nn::basic_linear<float, S>(64, 3, g));
    return m;
  };
  int const n = comm.world_size(), r = comm.rank();
  std::int64_t const local = global_batch / n;
  Generator dg(4);
  Tensor<float> x(Shape{global_batch * steps, 1, 8, 8});
  Tensor<std::int32_t> y(Shape{global_batch * steps});
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = dg.uniform(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = static_cast<std::int32_t>(dg.below(3));
  auto slice_x = [&](std::int64_t from, std::int64_t count) {
    Tensor<float> t(Shape{count, 1, 8, 8});
    std::copy(x.data() + from * 64, x.data() + (from + count) * 64, t.data());
    return t;
  };
  auto slice_y = [&](std::int64_t from, std::int64_t count) {
    Tensor<std::int32_t> t(Shape{count});
    std::copy(y.data() + from, y.data() + from + count, t.data());
    return t;
  };
  auto model = build(std::type_identity<Dev>{});
  DistributedDataParallel ddp(model, comm);
  optim::basic_sgd<float, Dev> opt(ddp.parameters(), {.lr = 0.1, .momentum = 0.9});
  auto ref = build(std::type_identity<HostSpace>{});
  nn::ParameterArena<float> rp(ref);
  optim::SGD ref_opt(rp, {.lr = 0.1, .momentum = 0.9});
  for (int s = 0; s < steps; ++s) {
    std::int64_t const base = s * global_batch;
    opt.zero_grad();
    backward(cross_entropy(ddp(Variable<float, Dev>(to_space<Dev>(slice_x(base + r * local, local)))),
                           to_space<Dev>(slice_y(base + r * local, local))));
    opt.step();
    ref_opt.zero_grad();
    backward(cross_entropy(ref(Var(slice_x(base, global_batch))), slice_y(base, global_batch)));
    ref_opt.step();
  }
  return rel_diff(weights(ddp.parameters()), weights(rp));
}

}  // namespace ddp::test::device
