// SyncBatchNorm scenarios written once over any Communicator: run inside doctest on the threads backend
// (sync_batch_norm_test.cpp) and as a plain program under mpirun -n 2 / -n 4 (sync_batch_norm_mpi_main.cpp).
// The oracle is single-process BatchNorm2d over the global batch (the ranks' batches concatenated in rank
// order), with a different batch size on each rank as in PyTorch's test_distributed. Each scenario throws
// std::runtime_error on failure.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/comm/recording.hpp"
#include "ddp/ddp.hpp"

namespace ddp::test::sbn {

inline void expect(bool ok, std::string const& what) {
  if (!ok) throw std::runtime_error(what);
}
inline std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}

// How the global batch is split: rank r holds r+1 samples, 2r+1, or r+2 except rank 1, which holds none.
enum class BatchSplit { kRankPlusOne, kTwoRankPlusOne, kNoneOnRankOne };
inline std::string name(BatchSplit s) {
  switch (s) {
    case BatchSplit::kRankPlusOne:
      return "r+1";
    case BatchSplit::kTwoRankPlusOne:
      return "2r+1";
    case BatchSplit::kNoneOnRankOne:
      return "r+2, none on rank 1";
  }
  return "?";
}
inline std::vector<std::int64_t> batch_sizes(BatchSplit s, int world) {
  std::vector<std::int64_t> n(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r)
    n[r] = s == BatchSplit::kRankPlusOne ? r + 1 : s == BatchSplit::kTwoRankPlusOne ? 2 * r + 1 : (r == 1 ? 0 : r + 2);
  return n;
}

// Global (N, C, H, W) data, the same on every rank (seeded): channel c has mean ≈ 2c - 1 + offset and spread
// ≈ 1 + c/2.
inline Tensor<double> global_input(std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W, std::uint64_t seed,
                                   double offset = 0) {
  Generator g(seed);
  Tensor<double> x(Shape{N, C, H, W});
  std::int64_t const HW = H * W;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    std::int64_t const c = (i / HW) % C;
    x[i] = offset + (2.0 * double(c) - 1.0) + (1.0 + 0.5 * double(c)) * double(g.uniform(-1.0f, 1.0f));
  }
  return x;
}
inline Tensor<double> uniform(Shape s, std::uint64_t seed) {
  Generator g(seed);
  Tensor<double> t(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = double(g.uniform(-1.0f, 1.0f));
  return t;
}
// Samples [from, from + count) of an (N, ...) tensor, converted to T.
template <class T>
Tensor<T> samples(Tensor<double> const& t, std::int64_t from, std::int64_t count) {
  Shape const& s = t.shape();
  std::int64_t const w = s.numel_from(1);
  Tensor<T> r(Shape{count, s[1], s[2], s[3]});
  for (std::int64_t i = 0; i < count * w; ++i) r[i] = T(t[from * w + i]);
  return r;
}
template <class T>
Tensor<T> converted(Tensor<double> const& t) {
  Tensor<T> r(t.shape());
  for (std::int64_t i = 0; i < t.numel(); ++i) r[i] = T(t[i]);
  return r;
}

// max |a - b| over the elements, and max |b|, accumulated over several comparisons.
struct Diff {
  double abs = 0, ref = 0;
  template <class A, class B>
  void add(A const* a, B const* b, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) {
      abs = std::max(abs, std::abs(double(a[i]) - double(b[i])));
      ref = std::max(ref, std::abs(double(b[i])));
    }
  }
  double rel() const { return abs / std::max(ref, 1e-30); }
};

// Relative max differences from the double-precision single-process reference.
struct LayerDiffs {
  double y = 0, grad_x = 0, grad_weight = 0, grad_bias = 0, running = 0, eval = 0;
  double max() const { return std::max({y, grad_x, grad_weight, grad_bias, running, eval}); }
  std::string str() const {
    return "y " + num(y) + ", grad x " + num(grad_x) + ", grad weight " + num(grad_weight) + ", grad bias " +
           num(grad_bias) + ", running stats " + num(running) + ", eval " + num(eval);
  }
};

inline std::size_t count_of(std::vector<CollectiveRecord> const& recs, CollectiveKind k, std::string_view label) {
  return static_cast<std::size_t>(std::count_if(
      recs.begin(), recs.end(), [&](CollectiveRecord const& r) { return r.op == k && r.tag.label == label; }));
}

// SyncBatchNorm2d<T> on each rank's slice vs BatchNorm2d<double> on the global batch, `steps` training steps
// (outputs, input gradients, weight/bias gradients summed over ranks, running statistics), then evaluation.
// Loss: Σ w ⊙ y / N over the global batch (each rank sums its own slice), so the input gradients are the
// global loss's and the ranks' weight/bias gradients add up to it. Also checks the collectives: one all-gather
// per training forward, one all-reduce per backward, nothing in evaluation; and that the running statistics
// are bitwise identical on every rank. `offset` shifts every value (a mean far from 0 relative to the spread).
template <class T, Communicator Comm>
LayerDiffs layer_equivalence(Comm& comm, BatchSplit split, int steps = 3, double offset = 0) {
  int const world = comm.world_size(), r = comm.rank();
  std::int64_t const C = 3, H = 2, W = 3;
  auto const n = batch_sizes(split, world);
  std::int64_t const N = std::accumulate(n.begin(), n.end(), std::int64_t{0});
  std::int64_t const off = std::accumulate(n.begin(), n.begin() + r, std::int64_t{0}), mine = n[r];
  nn::BatchNormOptions const opt{.momentum = 0.2, .eps = 1e-4};

  Recording<Comm> rec(comm);
  nn::basic_sync_batch_norm2d<Recording<Comm>, T> layer(C, rec, opt);
  nn::basic_batch_norm2d<double> ref(C, opt);
  for (std::int64_t c = 0; c < C; ++c) {
    layer.weight.value().data()[c] = T(0.5 + 0.25 * double(c));
    layer.bias.value().data()[c] = T(0.1 * double(c) - 0.2);
    ref.weight.value().data()[c] = 0.5 + 0.25 * double(c);
    ref.bias.value().data()[c] = 0.1 * double(c) - 0.2;
  }
  Diff dy, dgx, dgw, dgb, drun;
  std::int64_t const slice = mine * C * H * W;
  for (int s = 0; s < steps; ++s) {
    auto const xg = global_input(N, C, H, W, 100 + std::uint64_t(s), offset);
    auto const wg = uniform(xg.shape(), 200 + std::uint64_t(s));
    // Reference: the global batch in double.
    Variable<double> xr(clone(xg), RequiresGrad::kYes);
    auto yr = ref(xr);
    ref.weight.zero_grad();
    ref.bias.zero_grad();
    backward(scale(sum(mul(yr, Variable<double>(wg))), 1.0 / double(N)));
    // This rank's slice.
    Variable<T> x(samples<T>(xg, off, mine), RequiresGrad::kYes);
    rec.clear();
    auto y = layer(x);
    layer.weight.zero_grad();
    layer.bias.zero_grad();
    backward(scale(sum(mul(y, Variable<T>(samples<T>(wg, off, mine)))), T(1.0 / double(N))));
    expect(count_of(rec.records(), CollectiveKind::kAllGather, "sync_batch_norm.stats") == (world > 1 ? 1u : 0u),
           "one all-gather of the statistics per training forward");
    expect(count_of(rec.records(), CollectiveKind::kAllReduce, "sync_batch_norm.grad") == (world > 1 ? 1u : 0u),
           "one all-reduce of the gradient sums per backward");
    expect(
        rec.records().size() == (world > 1 ? (s == 0 ? 3u : 2u) : 0u),
        "SyncBatchNorm issued " + std::to_string(rec.records().size()) + " collectives in step " + std::to_string(s));
    rec.clear();
    dy.add(y.value().data(), yr.value().data() + off * C * H * W, slice);
    if (mine > 0) dgx.add(x.grad().data(), xr.grad().data() + off * C * H * W, slice);
    // weight/bias gradients: this rank's share; their sum over ranks is the global batch's.
    std::vector<double> g(2 * C);
    for (std::int64_t c = 0; c < C; ++c) g[c] = layer.weight.grad()[c], g[C + c] = layer.bias.grad()[c];
    host_all_reduce(comm, std::span<double>(g), ReduceOp::kSum);
    dgw.add(g.data(), ref.weight.grad().data(), C);
    dgb.add(g.data() + C, ref.bias.grad().data(), C);
    drun.add(layer.running_mean.data(), ref.running_mean.data(), C);
    drun.add(layer.running_var.data(), ref.running_var.data(), C);
  }
  // Running statistics: bitwise the same on every rank.
  std::vector<double> run(2 * C), all_run(2 * C * static_cast<std::size_t>(world));
  for (std::int64_t c = 0; c < C; ++c) run[c] = layer.running_mean[c], run[C + c] = layer.running_var[c];
  host_all_gather(comm, std::span<double const>(run), std::span<double>(all_run));
  for (int q = 1; q < world; ++q)
    for (std::int64_t i = 0; i < 2 * C; ++i)
      expect(all_run[q * 2 * C + i] == all_run[i],
             "running statistics differ between rank 0 and rank " + std::to_string(q));

  // Evaluation: running statistics, no communication.
  layer.set_mode(Mode::kEval);
  ref.set_mode(Mode::kEval);
  auto const xg = global_input(N, C, H, W, 300, offset);
  auto yr = ref(Variable<double>(clone(xg)));
  auto y = layer(Variable<T>(samples<T>(xg, off, mine)));
  expect(rec.records().empty(), "SyncBatchNorm2d communicated in evaluation mode");
  Diff de;
  de.add(y.value().data(), yr.value().data() + off * C * H * W, slice);

  // The relative differences, each rank's maximum reported everywhere.
  std::vector<double> d{
      dy.abs / std::max(dy.ref, 1e-30), dgx.abs / std::max(dgx.ref, 1e-30), dgw.rel(), dgb.rel(), drun.rel(),
      de.abs / std::max(de.ref, 1e-30)};
  host_all_reduce(comm, std::span<double>(d), ReduceOp::kMax);
  return {d[0], d[1], d[2], d[3], d[4], d[5]};
}

// ---- DistributedDataParallel with a converted model ----

using Cnn =
    nn::Sequential<nn::Named<nn::Conv2d>, nn::Named<nn::BatchNorm2d>, nn::ReLU, nn::Flatten, nn::Named<nn::Linear>>;
inline Cnn make_cnn(std::uint64_t seed) {
  Generator g(seed);
  return Cnn(nn::named("conv", nn::Conv2d(2, 4, 3, g, {.padding = 1})),
             nn::named("bn", nn::BatchNorm2d(4, {.momentum = 0.3})), nn::ReLU(), nn::Flatten(),
             nn::named("fc", nn::Linear(4 * 4 * 4, 3, g)));
}

struct DdpDiffs {
  double grads = 0;    // BatchNorm weight/bias gradients after DDP's averaging, first step
  double weights = 0;  // every parameter after the last step
  double running = 0;  // running statistics after the last step
  double max() const { return std::max({grads, weights, running}); }
  std::string str() const {
    return "bn grads " + num(grads) + ", weights " + num(weights) + ", running stats " + num(running);
  }
};

// convert_sync_batchnorm(Conv2d, BatchNorm2d, ReLU, Flatten, Linear) under DDP with a different batch size on
// each rank vs one process (plain BatchNorm2d) on the global batch, `steps` SGD-momentum steps. Rank r's mean
// loss is scaled by world·n_r/N (PyTorch's test does the same), so DDP's average is the global mean loss's
// gradient. Ranks start from different seeds: DDP broadcasts rank 0's parameters and buffers.
template <AsyncCommunicator Comm>
DdpDiffs ddp_equivalence(Comm& comm, BatchSplit split, DdpOptions opts = {}, int steps = 4) {
  int const world = comm.world_size(), r = comm.rank();
  auto const n = batch_sizes(split, world);
  std::int64_t const N = std::accumulate(n.begin(), n.end(), std::int64_t{0});
  std::int64_t const off = std::accumulate(n.begin(), n.begin() + r, std::int64_t{0}), mine = n[r];
  auto model = make_cnn(5 + static_cast<std::uint64_t>(r));
  auto synced = nn::convert_sync_batchnorm(model, comm);
  static_assert(std::same_as<decltype(synced.template get<1>()), nn::SyncBatchNorm2d<Comm>&>);
  DistributedDataParallel ddp(synced, comm, opts);
  optim::SGD opt(ddp.parameters(), {.lr = 0.1, .momentum = 0.9});
  auto ref = make_cnn(5);
  nn::ParameterArena<float> ref_params(ref);
  optim::SGD ref_opt(ref_params, {.lr = 0.1, .momentum = 0.9});
  DdpDiffs out;
  for (int s = 0; s < steps; ++s) {
    auto const xg = global_input(N, 2, 4, 4, 400 + std::uint64_t(s));
    auto const tg = uniform(Shape{N, 3}, 500 + std::uint64_t(s));
    Tensor<float> t(Shape{mine, 3});
    for (std::int64_t i = 0; i < mine * 3; ++i) t[i] = float(tg[off * 3 + i]);
    opt.zero_grad();
    backward(scale(mse_loss(ddp(Var(samples<float>(xg, off, mine))), t), float(world) * float(mine) / float(N)));
    ref_opt.zero_grad();
    backward(mse_loss(ref(Var(converted<float>(xg))), converted<float>(tg)));
    if (s == 0) {
      Diff d;
      d.add(synced.template get<1>().weight.grad().data(), ref.get<1>().weight.grad().data(), 4);
      d.add(synced.template get<1>().bias.grad().data(), ref.get<1>().bias.grad().data(), 4);
      out.grads = d.rel();
    }
    opt.step();
    ref_opt.step();
  }
  Diff dw, drun;
  auto const a = ddp.parameters().entries();
  auto const b = ref_params.entries();
  expect(a.size() == b.size(), "parameter counts differ");
  for (std::size_t i = 0; i < a.size(); ++i) dw.add(a[i].var.value().data(), b[i].var.value().data(), a[i].numel);
  auto const ba = synced.named_buffers(), bb = ref.named_buffers();
  expect(ba.size() == 2 && bb.size() == 2 && ba[0].name == "bn.running_mean" && ba[1].name == "bn.running_var",
         "buffers of the converted model: bn.running_mean, bn.running_var");
  std::vector<double> run;
  for (std::size_t i = 0; i < ba.size(); ++i) {
    drun.add(ba[i].tensor.data(), bb[i].tensor.data(), ba[i].tensor.numel());
    for (std::int64_t j = 0; j < ba[i].tensor.numel(); ++j) run.push_back(ba[i].tensor[j]);
  }
  // The running statistics agree bitwise across ranks, with or without DDP's buffer broadcast.
  std::vector<double> all_run(run.size() * static_cast<std::size_t>(world));
  host_all_gather(comm, std::span<double const>(run), std::span<double>(all_run));
  for (int q = 1; q < world; ++q)
    for (std::size_t i = 0; i < run.size(); ++i)
      expect(all_run[q * run.size() + i] == all_run[i],
             "running statistics differ between rank 0 and rank " + std::to_string(q));
  out.weights = dw.rel();
  out.running = drun.rel();
  std::vector<double> d{out.grads, out.weights, out.running};
  host_all_reduce(comm, std::span<double>(d), ReduceOp::kMax);
  return {d[0], d[1], d[2]};
}

// ---- errors ----

// Rank 1 builds the layer with 3 channels, the others with 4: the first training forward raises the same
// DdpError on every rank, naming both counts (no size-mismatched collective is ever issued).
template <Communicator Comm>
void channel_mismatch(Comm& comm) {
  std::int64_t const C = comm.rank() == 1 ? 3 : 4;
  nn::SyncBatchNorm2d<Comm> layer(C, comm);
  try {
    layer(Var(converted<float>(uniform(Shape{2, C, 2, 2}, 1))));
  } catch (DdpError const& e) {
    std::string const m = e.what();
    expect(m.find("SyncBatchNorm2d") != std::string::npos && m.find("rank 0 has 4") != std::string::npos &&
               m.find("rank 1 has 3") != std::string::npos,
           "channel mismatch message lacks the layer or the counts: " + m);
    return;
  }
  throw std::runtime_error("no DdpError on rank " + std::to_string(comm.rank()) + " for mismatched channel counts");
}

// Rank 0 holds one 1×1 sample, every other rank none: one value per channel in all is a ShapeError on every rank.
template <Communicator Comm>
void too_few_values(Comm& comm) {
  nn::SyncBatchNorm2d<Comm> layer(2, comm);
  std::int64_t const mine = comm.rank() == 0 ? 1 : 0;
  try {
    layer(Var(converted<float>(uniform(Shape{mine, 2, 1, 1}, 3))));
  } catch (ShapeError const& e) {
    std::string const m = e.what();
    expect(m.find("more than one value per channel") != std::string::npos &&
               m.find(std::to_string(comm.world_size()) + " ranks, got 1") != std::string::npos,
           "too-few-values message: " + m);
    return;
  }
  throw std::runtime_error("no ShapeError on rank " + std::to_string(comm.rank()) + " for a global batch of one value");
}

// Wrong input shapes are local ShapeErrors raised before any collective (here every rank makes the mistake).
template <Communicator Comm>
void bad_input_shapes(Comm& comm) {
  Recording<Comm> rec(comm);
  nn::basic_sync_batch_norm2d<Recording<Comm>> layer(4, rec);
  layer(Var(converted<float>(uniform(Shape{2, 4, 2, 2}, 4))));  // verified and synchronised once
  rec.clear();
  auto expect_shape_error = [&](Shape s, std::string const& needle) {
    try {
      layer(Var(converted<float>(uniform(s, 5))));
    } catch (ShapeError const& e) {
      expect(std::string(e.what()).find(needle) != std::string::npos, std::string("shape error message: ") + e.what());
      return;
    }
    throw std::runtime_error("no ShapeError for input shape " + std::to_string(s.rank()) + "-d");
  };
  if (comm.world_size() > 1) {
    expect_shape_error(Shape{2, 3, 2, 2}, "input has 3 channels but gamma/beta/running stats have shapes [4]");
    expect_shape_error(Shape{2, 4, 4}, "sync_batch_norm2d: input must be (N,C,H,W)");
  } else {
    expect_shape_error(Shape{2, 3, 2, 2}, "input has 3 channels");  // one rank: plain batch_norm2d
  }
  expect(rec.records().empty(), "a rejected input issued a collective");
}

}  // namespace ddp::test::sbn
