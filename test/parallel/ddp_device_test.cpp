// DistributedDataParallel over device tensors (Thrust's CPU system) on the threads backend, which takes device
// memory when the device system's memory is host-accessible: N ranks on B/N equal one process on B, and equal
// the same training on host tensors; the same model through the HostStaging adapter; unused parameters and
// no_sync on device models.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/tensor/device.hpp"
#include "test/parallel/ddp_cases.hpp"

using namespace ddp;

namespace {

using Dev = DeviceSpace;

template <MemorySpace S>
using Mlp = nn::Sequential<nn::Named<nn::basic_linear<float, S>>, nn::basic_relu<float, S>, nn::Named<nn::basic_linear<float, S>>>;

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

double rel_diff(std::vector<float> const& a, std::vector<float> const& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, maxw = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, double(std::abs(a[i] - b[i])));
    maxw = std::max(maxw, double(std::abs(b[i])));
  }
  return diff / std::max(1.0, maxw);
}

// One process on the global batch, on host tensors: the reference every device run is compared with.
std::vector<float> host_reference(test::Data const& data, std::int64_t global_batch, int steps) {
  auto ref = make_mlp<HostSpace>(8, 32, 4, 1);
  nn::ParameterArena<float> p(ref);
  optim::SGD opt(p, {.lr = 0.05, .momentum = 0.9});
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    backward(mse_loss(ref(Var(test::rows(data.x, s * global_batch, global_batch))), test::rows(data.y, s * global_batch, global_batch)));
    opt.step();
  }
  return weights(p);
}

// N ranks, each on its B/N rows, training a device model under DDP (SGD with momentum). Returns the weights.
template <AsyncCommunicator C>
std::vector<float> device_ddp(C& comm, test::Data const& data, std::int64_t global_batch, int steps, BucketConfig buckets = {}) {
  int const n = comm.world_size(), r = comm.rank();
  std::int64_t const local = global_batch / n;
  auto model = make_mlp<Dev>(8, 32, 4, 1 + static_cast<std::uint64_t>(r));  // rank 0's weights are broadcast
  DistributedDataParallel ddp(model, comm, {}, SizeCapped{buckets});
  optim::basic_sgd<float, Dev> opt(ddp.parameters(), {.lr = 0.05, .momentum = 0.9});
  for (int s = 0; s < steps; ++s) {
    std::int64_t const base = s * global_batch + r * local;
    opt.zero_grad();
    auto x = to_space<Dev>(test::rows(data.x, base, local));
    auto y = to_space<Dev>(test::rows(data.y, base, local));
    backward(mse_loss(ddp(Variable<float, Dev>(x)), y));
    opt.step();
  }
  return weights(ddp.parameters());
}

}  // namespace

TEST_CASE("ThreadsBackend takes device memory on the CPU device system; MpiBackend-style host-only lists do not") {
  static_assert(ThreadsBackend::accepted_spaces::contains<DeviceSpace>);
  static_assert(!SpaceList<HostSpace>::contains<DeviceSpace>);
  static_assert(HostStaging<ThreadsBackend>::accepted_spaces::contains<DeviceSpace>);
  static_assert(AsyncCommunicator<HostStaging<ThreadsBackend>>);
  spawn(2, [](ThreadsBackend& comm) {
    Tensor<float, Dev> t(Shape{5});
    Kernels<Dev>::fill(5, float(comm.rank() + 1), t.data());
    comm.all_reduce(t.span(), ReduceOp::kSum);
    auto v = host_values(t);
    for (float e : v) CHECK(e == 3.0f);
  });
}

TEST_CASE("device tensors: N ranks on B/N equal one process on B, and the host run, after 20 SGD-momentum steps") {
  std::int64_t const B = 16;
  int const steps = 20;
  auto data = test::make_data(B * steps, 8, 4, 99);
  auto const host = host_reference(data, B, steps);
  for (int n : {1, 2, 4}) {
    for (BucketConfig cfg : {BucketConfig{}, BucketConfig{.cap_bytes = 256, .first_cap_bytes = 64}}) {
      CAPTURE(n);
      CAPTURE(cfg.cap_bytes);
      std::vector<std::vector<float>> w(n);
      spawn(n, [&](ThreadsBackend& comm) { w[comm.rank()] = device_ddp(comm, data, B, steps, cfg); });
      for (int r = 0; r < n; ++r) {
        CHECK(w[r] == w[0]);                  // bitwise the same on every rank
        CHECK(rel_diff(w[r], host) <= 1e-6);  // and the host single-process run
      }
    }
  }
}

TEST_CASE("device tensors through HostStaging<ThreadsBackend> train as through the backend itself") {
  std::int64_t const B = 8;
  int const steps = 5;
  auto data = test::make_data(B * steps, 8, 4, 7);
  std::vector<std::vector<float>> direct(2), staged(2);
  spawn(2, [&](ThreadsBackend& comm) {
    direct[comm.rank()] = device_ddp(comm, data, B, steps);
    HostStaging<ThreadsBackend> st(comm);
    staged[comm.rank()] = device_ddp(st, data, B, steps);
  });
  CHECK(direct[0] == staged[0]);
  CHECK(direct[1] == staged[1]);
}

TEST_CASE("device tensors: an unused parameter is an error on every rank; find_unused_parameters averages") {
  // fc2 only on rank 0: the other ranks' forward stops at fc1.
  struct Branchy {
    using value_type = float;
    using space = Dev;
    nn::basic_linear<float, Dev> fc1, extra;
    bool use_extra = true;
    explicit Branchy(Generator& g) : fc1(4, 3, g), extra(3, 3, g) {}
    Variable<float, Dev> forward(Variable<float, Dev> const& x) {
      auto h = fc1(x);
      return use_extra ? extra(h) : h;
    }
    std::vector<nn::NamedParameter<float, Dev>> named_parameters() const {
      std::vector<nn::NamedParameter<float, Dev>> ps;
      std::vector<nn::NamedBuffer<float, Dev>> bs;
      nn::append_prefixed("fc1", fc1, ps, bs);
      nn::append_prefixed("extra", extra, ps, bs);
      return ps;
    }
    std::vector<nn::NamedBuffer<float, Dev>> named_buffers() const { return {}; }
    void set_mode(Mode) {}
    Mode mode() const { return Mode::kTrain; }
  };
  spawn(2, [](ThreadsBackend& comm) {
    Generator g(5);
    Branchy model(g);
    model.use_extra = comm.rank() == 0;
    Variable<float, Dev> x(to_space<Dev>(full<float>({2, 4}, 1.0f)));
    {
      DistributedDataParallel ddp(model, comm);
      bool threw = false;
      try {
        backward(sum(ddp(x)));
      } catch (DdpError const& e) {
        threw = std::string(e.what()).find("'extra.weight'") != std::string::npos;
      }
      CHECK(threw);
    }
    DistributedDataParallel ddp(model, comm, {.find_unused_parameters = true});
    ddp.parameters().zero_grad();
    backward(sum(ddp(x)));
    CHECK(host_values(ddp.parameters().find("extra.bias").var.grad())[0] == doctest::Approx(1.0f));  // 2 / world
  });
}

TEST_CASE("device tensors: no_sync accumulation then one synced step equals one big batch") {
  spawn(2, [](ThreadsBackend& comm) {
    int const r = comm.rank();
    auto data = test::make_data(8, 8, 4, 3);
    auto model = make_mlp<Dev>(8, 16, 4, 3);
    DistributedDataParallel ddp(model, comm);
    ddp.parameters().zero_grad();
    for (int m = 0; m < 2; ++m) {
      std::int64_t const base = (m * 2 + r) * 2;
      auto step = [&] {
        auto x = to_space<Dev>(test::rows(data.x, base, 2));
        backward(scale(mse_loss(ddp(Variable<float, Dev>(x)), to_space<Dev>(test::rows(data.y, base, 2))), 0.5f));
      };
      if (m == 0) {
        auto guard = ddp.no_sync();
        step();
      } else {
        step();
      }
    }
    auto ref = make_mlp<HostSpace>(8, 16, 4, 3);
    nn::ParameterArena<float> rp(ref);
    backward(mse_loss(ref(Var(data.x)), data.y));
    for (std::size_t i = 0; i < rp.entries().size(); ++i) {
      auto a = host_values(ddp.parameters().entries()[i].var.grad());
      auto b = host_values(rp.entries()[i].var.grad());
      double d = 0;
      for (std::size_t j = 0; j < a.size(); ++j) d = std::max(d, double(std::abs(a[j] - b[j])));
      CHECK(d <= 1e-6);
    }
  });
}
