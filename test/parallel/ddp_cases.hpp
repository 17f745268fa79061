// Multi-rank DDP scenarios written once over any Communicator: run inside doctest on the threads
// backend and as a plain program under mpirun (ddp_mpi_main.cpp). Each throws std::runtime_error on failure.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/comm/recording.hpp"
#include "ddp/ddp.hpp"

namespace ddp::test {

// N ranks on B/N against one process on B after 20 SGD-momentum steps: the largest weight difference relative to
// max(1, max|w|). 2.4e-7 is 4 float ulps at 1; the runs measure up to 6e-8 (README, "What DDP guarantees").
inline constexpr double kEquivalenceTolerance = 2.4e-7;

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
  DistributedDataParallel ddp(model, comm, {}, {.bucketer = SizeCapped{buckets}});
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

// fc1, then `extra` where use_extra holds: a branch some ranks skip (extra gets no gradient there), or that a rank
// drops between steps. Over host tensors (Branchy) or any other space.
template <MemorySpace S>
struct BasicBranchy {
  using value_type = float;
  using space = S;
  nn::basic_linear<float, S> fc1, extra;
  bool use_extra = true;
  explicit BasicBranchy(Generator& g) : fc1(4, 3, g), extra(3, 3, g) {}
  Variable<float, S> forward(Variable<float, S> const& x) {
    auto h = fc1(x);
    return use_extra ? extra(h) : h;
  }
  std::vector<nn::NamedParameter<float, S>> named_parameters() const {
    std::vector<nn::NamedParameter<float, S>> ps;
    std::vector<nn::NamedBuffer<float, S>> bs;
    nn::append_prefixed("fc1", fc1, ps, bs);
    nn::append_prefixed("extra", extra, ps, bs);
    return ps;
  }
  std::vector<nn::NamedBuffer<float, S>> named_buffers() const { return {}; }
  void set_mode(Mode) {}
  Mode mode() const { return Mode::kTrain; }
};
using Branchy = BasicBranchy<HostSpace>;

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
    auto step = [&] {
      backward(scale(mse_loss(ddp(Var(rows(data.x, base, micro))), rows(data.y, base, micro)), weight));
    };
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
    for (std::int64_t j = 0; j < a.numel; ++j)
      diff = std::max(diff, double(std::abs(a.var.grad()[j] - b.var.grad()[j])));
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
  DistributedDataParallel ddp(model, comm, {}, {.bucketer = SizeCapped{buckets}});
  auto data = make_data(8, 8, 4, 2);
  for (int s = 0; s < 2; ++s) {
    ddp.parameters().zero_grad();
    backward(mse_loss(ddp(Var(data.x)), data.y));
  }
  return comm.records();
}

// Gradients of every rank, gathered: max |g_rank0 − g_rank_r| over all parameters and ranks.
template <AsyncCommunicator C>
double grad_spread(C& comm, nn::ParameterArena<float> const& p) {
  std::vector<float> g;
  for (auto const& e : p.entries()) {
    Tensor<float> t = e.var.grad();
    for (std::int64_t j = 0; j < e.numel; ++j) g.push_back(t.defined() ? t[j] : 0.0f);
  }
  std::vector<float> all(g.size() * static_cast<std::size_t>(comm.world_size()));
  comm.all_gather(g, all);
  double d = 0;
  for (int r = 1; r < comm.world_size(); ++r)
    for (std::size_t j = 0; j < g.size(); ++j) d = std::max(d, double(std::abs(all[j] - all[r * g.size() + j])));
  return d;
}

// Defect 1 (GAN-style step): a backward through an unrelated model on the same thread, between DDP's
// forward and its own backward, must not consume DDP's end-of-step synchronisation. Returns the largest
// difference between the ranks' gradients and the single-process gradient of the global batch.
template <AsyncCommunicator C>
double unrelated_backward(C& comm, DdpOptions opts) {
  int const n = comm.world_size(), r = comm.rank();
  auto data = make_data(4 * n, 8, 4, 11);
  auto model = make_mlp(8, 16, 4, 3);
  DistributedDataParallel ddp(model, comm, opts);
  auto other = make_mlp(8, 16, 4, 4);  // e.g. a discriminator, not wrapped
  nn::ParameterArena<float> op(other);
  ddp.parameters().zero_grad();
  Var out = ddp(Var(rows(data.x, 4 * r, 4)));
  backward(sum(other(Var(rows(data.x, 4 * r, 4)))));  // unrelated backward on the same thread
  backward(mse_loss(out, rows(data.y, 4 * r, 4)));
  expect(grad_spread(comm, ddp.parameters()) == 0.0, "ranks hold different gradients after a GAN-style step");
  auto ref = make_mlp(8, 16, 4, 3);
  nn::ParameterArena<float> rp(ref);
  backward(mse_loss(ref(Var(data.x)), data.y));
  double diff = 0;
  for (std::size_t i = 0; i < rp.entries().size(); ++i) {
    Tensor<float> a = ddp.parameters().entries()[i].var.grad(), b = rp.entries()[i].var.grad();
    expect(a.defined(), "a used parameter lost its gradient: " + rp.entries()[i].name);
    for (std::int64_t j = 0; j < a.numel(); ++j) diff = std::max(diff, double(std::abs(a[j] - b[j])));
  }
  return diff;
}

// Defect 2: with find_unused_parameters, a parameter no rank used keeps no gradient and the optimizers
// leave it (and their state for it) alone; one used on some ranks only gets the average.
template <AsyncCommunicator C>
void globally_unused_is_skipped(C& comm) {
  for (int which : {0, 1}) {  // SGD with momentum and weight decay, then AdamW
    Generator g(5);
    Branchy model(g);
    model.use_extra = false;  // on every rank
    DistributedDataParallel ddp(model, comm, {.find_unused_parameters = true});
    auto& p = ddp.parameters();
    std::vector<float> before(p.find("extra.weight").var.value().data(), p.find("extra.weight").var.value().data() + 9);
    auto run = [&](auto& opt) {
      for (int s = 0; s < 3; ++s) {
        opt.zero_grad();
        backward(sum(ddp(Var(full<float>({2, 4}, 1.0f + float(comm.rank()))))));
        expect(!p.find("extra.weight").var.has_grad() && !p.find("extra.bias").var.has_grad(),
               "a parameter unused on every rank has a gradient");
        expect(p.find("fc1.weight").var.has_grad(), "a used parameter has no gradient");
        opt.step();
      }
    };
    if (which == 0) {
      optim::SGD opt(p, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1});
      run(opt);
    } else {
      optim::AdamW opt(p, {.lr = 0.1, .weight_decay = 0.1});
      run(opt);
    }
    Tensor<float> w = p.find("extra.weight").var.value();
    for (int j = 0; j < 9; ++j) expect(w[j] == before[j], "the optimizer moved a parameter no rank used");
  }
}

// Defect 4: an optimizer over an arena made before wrapping would update orphaned storage: wrapping says so.
template <AsyncCommunicator C>
void optimizer_before_wrap(C& comm) {
  auto model = make_mlp(8, 16, 4, 3);
  {
    optim::SGD early(nn::ParameterArena<float>(model), {.lr = 0.1});
    bool threw = false;
    try {
      DistributedDataParallel ddp(model, comm);
    } catch (ArgumentError const& e) {
      threw = std::string(e.what()).find("ddp.parameters()") != std::string::npos &&
              std::string(e.what()).find("'fc1.weight'") != std::string::npos;
      expect(threw, std::string("message does not say what to do: ") + e.what());
    }
    expect(threw, "wrapping a model whose parameters an optimizer holds did not raise");
  }
  // Once that optimizer is gone, wrapping works and an optimizer built afterwards trains the model.
  DistributedDataParallel ddp(model, comm);
  optim::SGD opt(ddp.parameters(), {.lr = 0.1});
  float const w0 = ddp.parameters().find("fc2.bias").var.value()[0];
  auto data = make_data(4, 8, 4, 1);
  opt.zero_grad();
  backward(mse_loss(ddp(Var(data.x)), data.y));
  opt.step();
  expect(model.named_parameters()[3].var.value()[0] != w0, "the optimizer did not move the model's parameter");
}

// Frozen parameters (requires_grad false) are accepted: broadcast from rank 0, never reduced or stepped.
// A user's gradient hook on a parameter keeps running under DDP, before the reduction sees the gradient.
template <AsyncCommunicator C>
void frozen_and_hooks(C& comm) {
  auto model = make_mlp(8, 16, 4, 1 + static_cast<std::uint64_t>(comm.rank()));
  auto params = model.named_parameters();
  params[0].var.node().requires_grad = false;  // fc1.weight frozen
  int calls = 0;
  params[3].var.set_grad_hook([&calls](Node<float, HostSpace>& nd) {  // fc2.bias: doubled before reduction
    ++calls;
    for (std::int64_t j = 0; j < nd.grad.numel(); ++j) nd.grad[j] *= 2.0f;
  });
  DistributedDataParallel ddp(model, comm);
  expect(ddp.parameters().count() == 3, "the frozen parameter was packed for reduction");
  auto data = make_data(4 * comm.world_size(), 8, 4, 5);
  Var x(rows(data.x, 4 * comm.rank(), 4));
  optim::SGD opt(ddp.parameters(), {.lr = 0.1});
  opt.zero_grad();
  backward(mse_loss(ddp(x), rows(data.y, 4 * comm.rank(), 4)));
  expect(calls == 1, "the user's gradient hook ran " + std::to_string(calls) + " times, expected 1");
  expect(grad_spread(comm, ddp.parameters()) == 0.0, "ranks hold different gradients");
  std::vector<float> w(params[0].var.value().data(), params[0].var.value().data() + params[0].var.numel());
  std::vector<float> all(w.size() * static_cast<std::size_t>(comm.world_size()));
  comm.all_gather(w, all);
  for (std::size_t j = 0; j < all.size(); ++j) expect(all[j] == w[j % w.size()], "frozen weights differ across ranks");
  opt.step();
  for (std::size_t j = 0; j < w.size(); ++j) expect(params[0].var.value()[j] == w[j], "a frozen parameter moved");
  // The hook's doubling reached the average: compare with a plain model on the global batch.
  auto ref = make_mlp(8, 16, 4, 1);
  backward(mse_loss(ref(Var(data.x)), data.y));
  auto rp = ref.named_parameters();
  Tensor<float> gb = params[3].var.grad();
  double d = 0;
  for (std::int64_t j = 0; j < gb.numel(); ++j) d = std::max(d, double(std::abs(gb[j] - 2.0f * rp[3].var.grad()[j])));
  expect(d <= 1e-5, "the hooked gradient is not twice the reference: " + std::to_string(d));
}

// A communicator that, on one rank, issues bucket 1's all-reduce before bucket 0's: that rank's buckets 0
// and 1 are reduced against the others' 1 and 0 (equal sizes, so no backend check can notice).
template <AsyncCommunicator C>
class SwapFirstBuckets : public Recording<C> {
 public:
  using inner_work = decltype(std::declval<C&>().all_reduce_async(std::declval<SpaceSpan<float, HostSpace>>(),
                                                                  ReduceOp::kAvg, CollectiveTag{}));
  struct Work {
    std::shared_ptr<std::optional<inner_work>> w;
    void wait() {
      expect(w->has_value(), "SwapFirstBuckets: bucket 0 waited on before bucket 1 was issued");
      (*w)->wait();
    }
    bool test() const { return w->has_value() && (*w)->test(); }
  };
  SwapFirstBuckets(C& inner, int swap_rank) : Recording<C>(inner), swap_rank_(swap_rank) {}
  template <detail::BufferLike B>
  Work all_reduce_async(B&& buf, ReduceOp op, CollectiveTag tag = {}) {
    auto s = detail::as_space_span(buf);
    auto slot = std::make_shared<std::optional<inner_work>>();
    bool const mine = this->rank() == swap_rank_ && tag.label == std::string_view("bucket");
    if (mine && tag.id == 0) {
      held_ = s;
      held_slot_ = slot;
      return Work{slot};
    }
    // Tags are dropped on the way down: ThreadsBackend compares them (and MpiBackend under DDP_DEBUG=DETAIL), which
    // would report the swap itself; this checks DDP's own bucket fingerprint, what catches it on any transport.
    slot->emplace(this->inner().all_reduce_async(s, op, CollectiveTag{}));
    if (mine && tag.id == 1 && held_slot_) {
      held_slot_->emplace(this->inner().all_reduce_async(*held_, op, CollectiveTag{}));
      held_slot_.reset();
    }
    return Work{slot};
  }

 private:
  int swap_rank_;
  std::optional<SpaceSpan<float, HostSpace>> held_;
  std::shared_ptr<std::optional<inner_work>> held_slot_;
};

// Defect 5: the bucket fingerprint is exact for any world size and names the ranks. Three equal buckets
// (one Linear(4,4) each); the last rank swaps its first two. Every rank must raise a DdpError naming a rank.
template <AsyncCommunicator C>
void bucket_fingerprint(C& inner) {
  SwapFirstBuckets<C> comm(inner, inner.world_size() - 1);
  Generator g(3);
  nn::Sequential model(nn::named("a", nn::Linear(4, 4, g)), nn::named("b", nn::Linear(4, 4, g)),
                       nn::named("c", nn::Linear(4, 4, g)));
  DistributedDataParallel ddp(model, comm, {}, {.bucketer = SizeCapped{{.cap_bytes = 80, .first_cap_bytes = 80}}});
  expect(ddp.plan().buckets.size() == 3, "expected three buckets");
  ddp.parameters().zero_grad();
  try {
    backward(sum(ddp(Var(full<float>({2, 4}, 1.0f)))));
  } catch (DdpError const& e) {
    std::string const m = e.what();
    int const last = inner.world_size() - 1;
    std::string const want = inner.rank() == last ? "rank 0 (bucket " : detail::cat("rank ", last, " (bucket 1)");
    expect(m.find(want) != std::string::npos && m.find("different orders") != std::string::npos,
           "fingerprint message does not name the rank: " + m);
    return;
  }
  throw std::runtime_error("rank " + std::to_string(inner.rank()) + ": swapped buckets were not detected");
}

// A user's GradientBucketer whose plan is not contiguous: bucket 0 holds the last parameter and the one two
// before it, skipping the one between (the arena lays parameters out in reverse registration order, so its slice
// would cover the skipped one's gradient and reduce it twice).
struct GappyBucketer {
  BucketPlan plan(std::span<std::int64_t const> numels, std::size_t) const {
    std::size_t const n = numels.size();
    BucketPlan p;
    p.bucket_of.assign(n, 1);
    p.buckets.push_back({.params = {n - 1, n - 3}, .numel = numels[n - 1] + numels[n - 3]});
    p.bucket_of[n - 1] = p.bucket_of[n - 3] = 0;
    Bucket rest;
    for (std::size_t k = n; k-- > 0;)
      if (k != n - 1 && k != n - 3) rest.params.push_back(k), rest.numel += numels[k];
    p.buckets.push_back(std::move(rest));
    return p;
  }
  std::string name() const { return "GappyBucketer"; }
};

// A plan with a gap is a clear ArgumentError at construction, on every rank, naming the bucket and the gap.
template <AsyncCommunicator C>
void plan_with_gap(C& comm) {
  auto model = make_mlp(8, 16, 4, 1);  // 4 parameters: fc1.weight, fc1.bias, fc2.weight, fc2.bias
  try {
    DistributedDataParallel ddp(model, comm, {}, DdpPolicies{.bucketer = GappyBucketer{}});
  } catch (ArgumentError const& e) {
    std::string const m = e.what();
    expect(m.find("bucket plan of GappyBucketer is malformed on rank(s) 0") != std::string::npos &&
               m.find("bucket 0 holds parameters 3 and then 1") != std::string::npos &&
               m.find("gap") != std::string::npos,
           "plan-gap message lacks the policy, bucket or gap: " + m);
    return;
  }
  throw std::runtime_error("rank " + std::to_string(comm.rank()) + ": a plan with a gap was accepted");
}

}  // namespace ddp::test
