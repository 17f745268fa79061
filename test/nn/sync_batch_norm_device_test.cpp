// SyncBatchNorm2d over device tensors (Thrust's CPU system) on the threads backend: the same op, written once over
// Kernels<S>, gives what the host layer gives on the same slices (r+1 samples on rank r).
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "ddp/tensor/device.hpp"
#include "test/nn/sync_batch_norm_cases.hpp"

using namespace ddp;
using Dev = DeviceSpace;

namespace {

struct Out {
  std::vector<float> y, gx, gw, gb, rm, rv;
};
template <class T, MemorySpace S>
std::vector<T> values(Tensor<T, S> const& t) {
  auto const h = to_space<HostSpace>(t);
  return std::vector<T>(h.data(), h.data() + h.numel());
}

template <MemorySpace S>
Out run(ThreadsBackend& comm, int steps) {
  int const r = comm.rank();
  auto const n = test::sbn::batch_sizes(test::sbn::BatchSplit::kRankPlusOne, comm.world_size());
  std::int64_t N = 0, off = 0;
  for (int q = 0; q < comm.world_size(); ++q) N += n[q], off += q < r ? n[q] : 0;
  nn::basic_sync_batch_norm2d<ThreadsBackend, float, S> layer(3, comm, {.momentum = 0.2});
  Out out;
  for (int s = 0; s < steps; ++s) {
    auto const xg = test::sbn::global_input(N, 3, 2, 3, 100 + std::uint64_t(s));
    auto const wg = test::sbn::uniform(xg.shape(), 200 + std::uint64_t(s));
    Variable<float, S> x(to_space<S>(test::sbn::samples<float>(xg, off, n[r])), RequiresGrad::kYes);
    auto y = layer(x);
    layer.weight.zero_grad();
    layer.bias.zero_grad();
    backward(
        scale(sum(mul(y, Variable<float, S>(to_space<S>(test::sbn::samples<float>(wg, off, n[r]))))), 1.0f / float(N)));
    out = {values(y.value()),         values(x.grad()),           values(layer.weight.grad()),
           values(layer.bias.grad()), values(layer.running_mean), values(layer.running_var)};
  }
  return out;
}

}  // namespace

TEST_CASE("SyncBatchNorm2d over device tensors equals the host layer (threads backend, 2 and 3 ranks)") {
  for (int world : {2, 3}) {
    std::vector<double> diff(static_cast<std::size_t>(world));
    spawn(world, [&](ThreadsBackend& comm) {
      Out const h = run<HostSpace>(comm, 2), d = run<Dev>(comm, 2);
      test::sbn::Diff df;
      for (auto [a, b] :
           {std::pair{&d.y, &h.y}, {&d.gx, &h.gx}, {&d.gw, &h.gw}, {&d.gb, &h.gb}, {&d.rm, &h.rm}, {&d.rv, &h.rv}}) {
        test::sbn::expect(a->size() == b->size(), "sizes differ");
        df.add(a->data(), b->data(), std::int64_t(a->size()));
      }
      diff[comm.rank()] = df.abs;
    });
    CAPTURE(world);
    MESSAGE("world ", world, ": max |device - host| ", *std::max_element(diff.begin(), diff.end()));
    for (double x : diff) CHECK(x <= 1e-6);
  }
}
