// Multi-rank DDP scenarios written once over any Communicator: run inside doctest on the threads
// backend and as a plain program under mpirun (ddp_mpi_main.cpp). Each throws std::runtime_error on failure.
#pragma once

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/comm/recording.hpp"
#include "ddp/ddp.hpp"

namespace ddp::test {

inline void expect(bool ok, std::string const& what) {
  if (!ok) throw std::runtime_error(what);
}

using Mlp = nn::Sequential<nn::Named<nn::Linear>, nn::ReLU, nn::Named<nn::Linear>>;
inline Mlp make_mlp(std::int64_t in, std::int64_t hidden, std::int64_t out, std::uint64_t seed) {
  Generator g(seed);
  return Mlp(nn::named("fc1", nn::Linear(in, hidden, g)), nn::ReLU(), nn::named("fc2", nn::Linear(hidden, out, g)));
}

struct Data {
  Tensor<float> x, y;
};
inline Data make_data(std::int64_t n, std::int64_t in, std::int64_t out, std::uint64_t seed) {
  Generator g(seed);
  Data d{Tensor<float>(Shape{n, in}), Tensor<float>(Shape{n, out})};
  for (std::int64_t i = 0; i < d.x.numel(); ++i) d.x[i] = g.uniform(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < d.y.numel(); ++i) d.y[i] = g.uniform(-1.0f, 1.0f);
  return d;
}
inline Tensor<float> rows(Tensor<float> const& t, std::int64_t from, std::int64_t count) {
  std::int64_t const w = t.numel() / t.shape()[0];
  Tensor<float> r(Shape{count, w});
  std::copy(t.data() + from * w, t.data() + (from + count) * w, r.data());
  return r;
}
inline std::vector<float> weights(nn::ParameterArena<float> const& a) {
  std::vector<float> w;
  for (auto const& e : a.entries()) w.insert(w.end(), e.var.value().data(), e.var.value().data() + e.numel);
  return w;
}

// N ranks on B/N samples each equal one process on B, after `steps` SGD-with-momentum steps. Returns
// max|Δ| / max(1, max|w|).
template <AsyncCommunicator C>
double equivalence(C& comm, std::int64_t global_batch = 16, int steps = 20, BucketConfig buckets = {}) {
  int const n = comm.world_size(), r = comm.rank();
  expect(global_batch % n == 0, "global batch must divide by the world size");
  std::int64_t const local = global_batch / n;
  auto data = make_data(global_batch * steps, 8, 4, 99);
  // Rank 0's initial weights win (broadcast): other ranks start from different seeds on purpose.
  auto model = make_mlp(8, 32, 4, 1 + static_cast<std::uint64_t>(r));
  DistributedDataParallel ddp(model, comm, {}, SizeCapped{buckets});
  optim::SGD opt(ddp.parameters(), {.lr = 0.05, .momentum = 0.9});
  auto ref = make_mlp(8, 32, 4, 1);
  nn::ParameterArena<float> ref_params(ref);
  optim::SGD ref_opt(ref_params, {.lr = 0.05, .momentum = 0.9});
  for (int s = 0; s < steps; ++s) {
    std::int64_t const base = s * global_batch;
    opt.zero_grad();
    backward(mse_loss(ddp(Var(rows(data.x, base + r * local, local))), rows(data.y, base + r * local, local)));
    opt.step();
    ref_opt.zero_grad();
    backward(mse_loss(ref(Var(rows(data.x, base, global_batch))), rows(data.y, base, global_batch)));
    ref_opt.step();
  }
  auto a = weights(ddp.parameters()), b = weights(ref_params);
  double diff = 0, maxw = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, double(std::abs(a[i] - b[i])));
    maxw = std::max(maxw, double(std::abs(b[i])));
  }
  return diff / std::max(1.0, maxw);
}

// Rank 1 builds fc2 with a different hidden size: every rank must raise a DdpError naming fc1.weight and
// both shapes.
template <AsyncCommunicator C>
void shape_mismatch(C& comm) {
  auto model = make_mlp(8, comm.rank() == 1 ? 31 : 32, 4, 1);
  try {
    DistributedDataParallel ddp(model, comm);
  } catch (DdpError const& e) {
    std::string const m = e.what();
    expect(m.find("fc1.weight") != std::string::npos && m.find("[32, 8]") != std::string::npos &&
               m.find("[31, 8]") != std::string::npos && m.find("rank 1") != std::string::npos,
           "mismatch message lacks the parameter or shapes: " + m);
    return;
  }
  throw std::runtime_error("no DdpError on rank " + std::to_string(comm.rank()) + " for mismatched shapes");
}

// A model with a branch only rank 0 uses: fc_extra gets no gradient on the other ranks.
struct Branchy {
  using value_type = float;
  using space = HostSpace;
  nn::Linear fc1, extra;
  bool use_extra = true;
  Branchy(Generator& g) : fc1(4, 3, g), extra(3, 3, g) {}
  Var forward(Var const& x) {
    Var h = fc1(x);
    return use_extra ? extra(h) : h;
  }
  std::vector<nn::NamedParameter<float, HostSpace>> named_parameters() const {
    std::vector<nn::NamedParameter<float, HostSpace>> ps;
    std::vector<nn::NamedBuffer<float, HostSpace>> bs;
    nn::append_prefixed("fc1", fc1, ps, bs);
    nn::append_prefixed("extra", extra, ps, bs);
    return ps;
  }
  std::vector<nn::NamedBuffer<float, HostSpace>> named_buffers() const { return {}; }
  void set_mode(Mode) {}
  Mode mode() const { return Mode::kTrain; }
};

template <AsyncCommunicator C>
void unused_parameter(C& comm) {
  Generator g(5);
  Branchy model(g);
  model.use_extra = comm.rank() == 0;
  {
    DistributedDataParallel ddp(model, comm);
    bool threw = false;
    try {
      backward(sum(ddp(Var(full<float>({2, 4}, 1.0f)))));
    } catch (DdpError const& e) {
      std::string const m = e.what();
      threw = true;
      if (comm.world_size() > 1)
        expect(m.find("'extra.weight'") != std::string::npos && m.find("'extra.bias'") != std::string::npos &&
                   m.find("rank(s) 1") != std::string::npos,
               "unused-parameter message lacks names or ranks: " + m);
    }
    expect(threw == (comm.world_size() > 1), "unused parameter not reported on rank " + std::to_string(comm.rank()));
  }
  // find_unused_parameters: missing gradients count as zero; extra's gradient is rank 0's divided by N.
  DistributedDataParallel ddp(model, comm, {.find_unused_parameters = true});
  ddp.parameters().zero_grad();
  backward(sum(ddp(Var(full<float>({2, 4}, 1.0f)))));
  float const gb = ddp.parameters().find("extra.bias").var.grad()[0];
  expect(std::abs(gb - 2.0f / float(comm.world_size())) < 1e-6f, "find_unused: extra.bias grad " + std::to_string(gb));
}

// k micro-batches under no_sync + one synchronised equal one batch k+1 times larger (sum of mean losses
// scaled by 1/(k+1)).
template <AsyncCommunicator C>
double no_sync_accumulation(C& comm) {
  int const n = comm.world_size(), r = comm.rank();
  int const k = 3, micro = 2;
  auto data = make_data(static_cast<std::int64_t>(n) * micro * (k + 1), 8, 4, 7);
  auto model = make_mlp(8, 16, 4, 3);
  DistributedDataParallel ddp(model, comm);
  auto& p = ddp.parameters();
  p.zero_grad();
  float const weight = 1.0f / float(k + 1);
  for (int m = 0; m <= k; ++m) {
    std::int64_t const base = (static_cast<std::int64_t>(m) * n + r) * micro;
    auto step = [&] { backward(scale(mse_loss(ddp(Var(rows(data.x, base, micro))), rows(data.y, base, micro)), weight)); };
    if (m < k) {
      auto guard = ddp.no_sync();
      step();
    } else {
      step();
    }
  }
  auto ref = make_mlp(8, 16, 4, 3);
  nn::ParameterArena<float> rp(ref);
  backward(mse_loss(ref(Var(data.x)), data.y));
  double diff = 0;
  for (std::size_t i = 0; i < p.entries().size(); ++i) {
    auto const& a = p.entries()[i];
    auto const& b = rp.entries()[i];
    for (std::int64_t j = 0; j < a.numel; ++j) diff = std::max(diff, double(std::abs(a.var.grad()[j] - b.var.grad()[j])));
  }
  return diff;
}

// BatchNorm running statistics follow rank 0 (broadcast before each forward).
template <AsyncCommunicator C>
void buffer_broadcast(C& comm) {
  nn::BatchNorm2d bn(2);
  bn.running_mean[0] = float(comm.rank() + 1);  // differs per rank before wrapping
  nn::Sequential model(bn);
  DistributedDataParallel ddp(model, comm);
  expect(bn.running_mean[0] == 1.0f, "construction did not broadcast buffers");
  bn.running_mean[1] = float(10 * (comm.rank() + 1));
  ddp.module().set_mode(Mode::kEval);
  NoGradGuard ng;
  ddp(Var(zeros<float>({1, 2, 2, 2})));
  expect(bn.running_mean[1] == 10.0f, "forward did not broadcast buffers from rank 0");
}

// One all-reduce per bucket per step, in plan order, the same on every rank; one broadcast per parameter.
template <AsyncCommunicator C>
std::vector<CollectiveRecord> collective_order(C& inner, BucketConfig buckets) {
  Recording<C> comm(inner);
  auto model = make_mlp(8, 64, 4, 1);
  DistributedDataParallel ddp(model, comm, {}, SizeCapped{buckets});
  auto data = make_data(8, 8, 4, 2);
  for (int s = 0; s < 2; ++s) {
    ddp.parameters().zero_grad();
    backward(mse_loss(ddp(Var(data.x)), data.y));
  }
  return comm.records();
}

}  // namespace ddp::test
