// A tied parameter (one Variable used by two ops: the token embedding and the output head) in every DDP
// composition, written once over any Communicator: run inside doctest on the threads backend (tied_test.cpp) and
// over MpiBackend and GlooBackend through ddp_suite.hpp. Each case takes one SGD step from the same weights on every
// rank, each rank on its shard of the global batch, and checks every rank's weights against w0 - lr * g, where g is
// the global batch's gradient computed apart, in double, as the sum of the table's two uses. Each throws
// std::runtime_error (via expect) on failure.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "ddp/parallel/deterministic.hpp"
#include "ddp/train/checkpoint.hpp"
#include "test/parallel/ddp_cases.hpp"

namespace ddp::test {

namespace tied {

inline constexpr std::int64_t kVocab = 11, kDim = 8;
inline constexpr std::int64_t kBatch = 8, kSeq = 5;  // the global batch: 8 sequences of 5 tokens (1, 2, 4 ranks)
inline constexpr double kLr = 0.1;
inline constexpr std::uint64_t kModelSeed = 3, kDataSeed = 21;
// float against the double reference: |w - (w0 - lr * g)| <= kRel * max(1, max|w0|). A float step lands within a
// few ulps (2^-24 relative) of w, so 1e-5 is loose for it; Reference checks that a step which lost either use of
// the table would miss by more than 30 times this.
inline constexpr double kRel = 1e-5;

// The tiny tied language model: logits = linear(layer_norm(embedding(wte, ids)), wte), x:(B, T) ids as float values
// -> (B, T, V). named_parameters() lists the table twice, as "wte.weight" and again as "lm_head.weight" (what
// PyTorch's state_dict shows for a tied head): the arena, DDP's cross-rank check and checkpoints keep it once,
// under its first name. Untied (on one rank, in the mismatch case), the head is a parameter of its own.
struct TiedLm {
  using value_type = float;
  using space = HostSpace;

  nn::Embedding wte;
  nn::LayerNorm ln_f{kDim};
  Var head;  // tied: wte.weight itself

  explicit TiedLm(std::uint64_t seed, std::int64_t vocab = kVocab, bool tied = true) : wte(table(seed, vocab)) {
    if (tied) {
      head = wte.weight;
    } else {
      Generator g(seed + 1);
      Tensor<float> h(Shape{vocab, kDim});
      nn::init::normal(h, 0.0, 1.0, g);
      head = Var(h, RequiresGrad::kYes);
    }
  }
  Var forward(Var const& x) { return linear(ln_f(wte(x)), head); }  // (B, T) -> (B, T, C) -> (B, T, V)
  std::vector<nn::NamedParameter<float, HostSpace>> named_parameters() const {
    std::vector<nn::NamedParameter<float, HostSpace>> ps;
    std::vector<nn::NamedBuffer<float, HostSpace>> bs;
    nn::append_prefixed("wte", wte, ps, bs);
    nn::append_prefixed("ln_f", ln_f, ps, bs);
    ps.push_back({"lm_head.weight", head});
    return ps;
  }
  std::vector<nn::NamedBuffer<float, HostSpace>> named_buffers() const { return {}; }
  void set_mode(Mode) {}
  Mode mode() const { return Mode::kTrain; }

 private:
  static nn::Embedding table(std::uint64_t seed, std::int64_t vocab) {
    Generator g(seed);
    return nn::Embedding(vocab, kDim, g);
  }
};
static_assert(nn::Model<TiedLm>);

// Token ids as float values (rows, T) and the targets (rows, T) as int32.
struct Batch {
  Tensor<float> x;
  Tensor<std::int32_t> y;
};
inline Batch make_batch(std::uint64_t seed, std::int64_t rows = kBatch) {
  Generator g(seed);
  Batch b{Tensor<float>(Shape{rows, kSeq}), Tensor<std::int32_t>(Shape{rows, kSeq})};
  for (std::int64_t i = 0; i < b.x.numel(); ++i) b.x[i] = static_cast<float>(g.below(kVocab));
  for (std::int64_t i = 0; i < b.y.numel(); ++i) b.y[i] = static_cast<std::int32_t>(g.below(kVocab));
  return b;
}
// Rows [lo, lo + rows), copied.
inline Batch rows_of(Batch const& b, std::int64_t lo, std::int64_t rows) {
  Batch s{Tensor<float>(Shape{rows, kSeq}), Tensor<std::int32_t>(Shape{rows, kSeq})};
  std::copy(b.x.data() + lo * kSeq, b.x.data() + (lo + rows) * kSeq, s.x.data());
  std::copy(b.y.data() + lo * kSeq, b.y.data() + (lo + rows) * kSeq, s.y.data());
  return s;
}
// Rank r's shard of the global batch: its contiguous kBatch / world rows.
inline Batch shard(Batch const& b, int rank, int world) {
  std::int64_t const local = b.x.shape()[0] / world;
  return rows_of(b, rank * local, local);
}

// A model's parameters by name, as float values: the table, the LayerNorm's weight and bias.
struct Weights {
  std::vector<float> wte, ln_w, ln_b;
  friend bool operator==(Weights const&, Weights const&) = default;
};
inline std::vector<float> values(Var const& v) { return {v.value().data(), v.value().data() + v.numel()}; }
inline Weights weights_of(TiedLm const& m) {
  return {values(m.wte.weight), values(m.ln_f.weight), values(m.ln_f.bias)};
}

// Which uses of the table take its gradient; the others read a constant copy of it.
enum class Use { kBoth, kEmbeddingOnly, kHeadOnly };
struct Grads {
  std::vector<double> wte, ln_w, ln_b;
};

// The gradient of the mean next-token loss over `b` in double, from the float weights `w`, written without the
// model: the table as one Variable in both ops (kBoth), or as a trainable Variable in one op and a constant copy in
// the other.
inline Grads grads_in_double(Weights const& w, Batch const& b, Use use) {
  using VarD = Variable<double>;
  auto tensor = [](std::vector<float> const& v, Shape const& s) {
    Tensor<double> t(s);
    for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = double(v[static_cast<std::size_t>(i)]);
    return t;
  };
  VarD const table(tensor(w.wte, Shape{kVocab, kDim}), RequiresGrad::kYes);
  VarD const constant(tensor(w.wte, Shape{kVocab, kDim}));
  VarD const ln_w(tensor(w.ln_w, Shape{kDim}), RequiresGrad::kYes),
      ln_b(tensor(w.ln_b, Shape{kDim}), RequiresGrad::kYes);
  Tensor<std::int32_t> ids(b.x.shape());
  for (std::int64_t i = 0; i < ids.numel(); ++i) ids[i] = static_cast<std::int32_t>(b.x[i]);
  VarD const h = layer_norm(embedding(use == Use::kHeadOnly ? constant : table, ids), ln_w, ln_b);
  backward(nn::gpt_loss(linear(h, use == Use::kEmbeddingOnly ? constant : table), b.y));
  auto out = [](VarD const& v) {
    Tensor<double> g = v.grad();
    return std::vector<double>(g.data(), g.data() + g.numel());
  };
  return {out(table), out(ln_w), out(ln_b)};
}

inline double max_abs(std::vector<double> const& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// The global batch's gradient at weights w0, as the sum of the table's two uses computed apart, checked against the
// plain backward of the tied graph; and each shard's gradient at `world` ranks (the compressed buckets' bound).
struct Reference {
  Weights w0;
  Grads g;
  std::vector<Grads> shards;
  double tol = 0;  // kRel * max(1, max|w0|)

  Reference(Weights const& w, Batch const& global, int world) : w0(w) {
    Grads const emb = grads_in_double(w, global, Use::kEmbeddingOnly);
    Grads const head = grads_in_double(w, global, Use::kHeadOnly);
    Grads const both = grads_in_double(w, global, Use::kBoth);
    g = emb;
    for (std::size_t i = 0; i < g.wte.size(); ++i) g.wte[i] += head.wte[i];
    double const scale = std::max(1.0, max_abs(g.wte));
    for (std::size_t i = 0; i < g.wte.size(); ++i)
      expect(std::abs(both.wte[i] - g.wte[i]) <= 1e-12 * scale,
             detail::cat("tied reference: the tied graph's gradient of wte[", i, "] is ", both.wte[i],
                         ", the sum of its two uses ", g.wte[i]));
    // The LayerNorm is used once: its gradient does not depend on which use of the table is trainable.
    for (auto const* o : {&emb, &head})
      for (std::size_t i = 0; i < g.ln_w.size(); ++i)
        expect(std::abs(o->ln_w[i] - both.ln_w[i]) <= 1e-12 && std::abs(o->ln_b[i] - both.ln_b[i]) <= 1e-12,
               "tied reference: the LayerNorm's gradient depends on which use of wte is trainable");
    double maxw = 1;
    for (auto const* v : {&w.wte, &w.ln_w, &w.ln_b})
      for (float x : *v) maxw = std::max(maxw, double(std::abs(x)));
    tol = kRel * maxw;
    // Each use alone moves the table by far more than the tolerance: a step that lost either would fail.
    expect(kLr * max_abs(emb.wte) > 30 * tol && kLr * max_abs(head.wte) > 30 * tol,
           detail::cat("tied reference: a use of wte moves it too little to be told apart (embedding ",
                       kLr * max_abs(emb.wte), ", head ", kLr * max_abs(head.wte), ", tolerance ", tol, ")"));
    for (int r = 0; r < world; ++r) shards.push_back(grads_in_double(w, shard(global, r, world), Use::kBoth));
  }
};

// Checks every element of `got` (weights after one step) against w0 - lr * g, within ref.tol plus extra(&Grads::m, i)
// for element i of parameter m (a lossy wire's bound; none by default).
template <class Extra>
void expect_step(std::string const& what, int rank, Weights const& got, Reference const& ref, Extra&& extra) {
  auto check = [&](char const* name, std::vector<float> const& w, std::vector<float> const& w0,
                   std::vector<double> const& g, auto member) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      double const want = double(w0[i]) - kLr * g[i];
      double const tol = ref.tol + extra(member, i);
      if (!(std::abs(double(w[i]) - want) <= tol))
        throw std::runtime_error(detail::cat(what, ": rank ", rank, ": '", name, "'[", i, "] is ", w[i],
                                             " after the step, w0 - lr * g is ", want, " (tolerance ", tol, ")"));
    }
  };
  check("wte.weight", got.wte, ref.w0.wte, ref.g.wte, &Grads::wte);
  check("ln_f.weight", got.ln_w, ref.w0.ln_w, ref.g.ln_w, &Grads::ln_w);
  check("ln_f.bias", got.ln_b, ref.w0.ln_b, ref.g.ln_b, &Grads::ln_b);
}
inline void expect_step(std::string const& what, int rank, Weights const& got, Reference const& ref) {
  expect_step(what, rank, got, ref, [](auto, std::size_t) { return 0.0; });
}

// Every rank holds bitwise the same weights.
template <AsyncCommunicator C>
void expect_same_on_every_rank(C& comm, std::string const& what, Weights const& w) {
  std::vector<float> mine = w.wte;
  mine.insert(mine.end(), w.ln_w.begin(), w.ln_w.end());
  mine.insert(mine.end(), w.ln_b.begin(), w.ln_b.end());
  std::vector<float> all(mine.size() * static_cast<std::size_t>(comm.world_size()));
  comm.all_gather(mine, all);
  for (std::size_t j = 0; j < all.size(); ++j)
    expect(all[j] == mine[j % mine.size()],
           detail::cat(what, ": rank ", comm.rank(), ": the ranks' weights differ after the step (rank ",
                       j / mine.size(), ", element ", j % mine.size(), ")"));
}

// The arena and the bucket plan hold the table once, as "wte.weight" (never under its alias): one entry, in exactly
// one bucket; `several_buckets`: the plan has two or more, else one.
template <class D>
void expect_held_once(D& ddp, std::string const& what, bool several_buckets) {
  auto const& es = ddp.parameters().entries();
  std::size_t wte = es.size(), named = 0;
  for (std::size_t i = 0; i < es.size(); ++i) {
    if (es[i].name.starts_with("wte")) ++named, wte = i;
    expect(es[i].name != "lm_head.weight", what + ": the arena holds the tied head under its alias 'lm_head.weight'");
  }
  expect(es.size() == 3 && named == 1 && es[wte].name == "wte.weight",
         detail::cat(what, ": the arena holds ", es.size(), " parameters, ", named, " of them named wte*"));
  expect(ddp.parameters().parameter_numel() == kVocab * kDim + 2 * kDim,
         detail::cat(what, ": the arena holds ", ddp.parameters().parameter_numel(), " parameter elements"));
  std::size_t in_plan = 0;
  for (auto const& b : ddp.plan().buckets)
    for (auto p : b.params) in_plan += p == wte;
  expect(in_plan == 1, detail::cat(what, ": the bucket plan holds wte.weight ", in_plan, " times"));
  std::size_t const nb = ddp.plan().buckets.size();
  expect(several_buckets ? nb >= 2 : nb == 1, detail::cat(what, ": ", nb, " buckets"));
}

// Counts the table's gradient-ready hook: the user's hook runs right before DDP's, once per backward.
inline void count_hook(TiedLm& m, int& calls) {
  m.wte.weight.set_grad_hook([&calls](Node<float, HostSpace>&) { ++calls; });
}

inline std::string bucket_name(BucketConfig cfg) {
  return cfg.cap_bytes == kDefaultBucketCapBytes ? "one bucket" : detail::cat("cap ", cfg.cap_bytes, " B");
}
// A cap below the table's float bytes splits the three parameters into two buckets or more.
inline bool several(BucketConfig cfg) { return cfg.cap_bytes < static_cast<std::size_t>(kVocab * kDim * 4); }

// One OnePass step of `mine`.
template <class D, class O>
void one_step(D& ddp, O& opt, Batch const& mine) {
  opt.zero_grad();
  backward(nn::gpt_loss(ddp(Var(mine.x)), mine.y));
  opt.step();
}

}  // namespace tied

// The reference on its own: the tied graph's gradient of wte is the sum of its two uses, each of which matters.
inline void tied_reference() {
  tied::Reference(tied::weights_of(tied::TiedLm(tied::kModelSeed)), tied::make_batch(tied::kDataSeed), 4);
}

// (a) AverageAllReduce with bucket config `cfg` (one bucket, or several): one SGD step.
template <AsyncCommunicator C>
void tied_average_all_reduce(C& comm, BucketConfig cfg) {
  using namespace tied;
  int const n = comm.world_size(), r = comm.rank();
  std::string const what = detail::cat("tied, AverageAllReduce, ", bucket_name(cfg), ", ", n, " ranks");
  Batch const global = make_batch(kDataSeed);
  TiedLm model(kModelSeed);
  Reference const ref(weights_of(model), global, n);
  int calls = 0;
  count_hook(model, calls);
  DistributedDataParallel ddp(model, comm, {}, {.bucketer = SizeCapped{cfg}});
  expect_held_once(ddp, what, several(cfg));
  optim::SGD opt(ddp.parameters(), {.lr = kLr});
  one_step(ddp, opt, shard(global, r, n));
  expect(calls == 1, detail::cat(what, ": the tied table's grad-ready hook fired ", calls, " times in one backward"));
  expect_step(what, r, weights_of(model), ref);
  expect_same_on_every_rank(comm, what, weights_of(model));
}

// (b) no_sync: each rank's shard as two micro-batches, the first inside no_sync, each mean loss scaled by 1/2.
template <AsyncCommunicator C>
void tied_no_sync(C& comm) {
  using namespace tied;
  int const n = comm.world_size(), r = comm.rank();
  std::string const what = detail::cat("tied, no_sync, ", n, " ranks");
  Batch const global = make_batch(kDataSeed);
  TiedLm model(kModelSeed);
  Reference const ref(weights_of(model), global, n);
  int calls = 0;
  count_hook(model, calls);
  DistributedDataParallel ddp(model, comm);
  optim::SGD opt(ddp.parameters(), {.lr = kLr});
  std::int64_t const half = kBatch / n / 2;
  Batch const mine = shard(global, r, n), first = rows_of(mine, 0, half), second = rows_of(mine, half, half);
  opt.zero_grad();
  {
    auto guard = ddp.no_sync();
    backward(scale(nn::gpt_loss(ddp(Var(first.x)), first.y), 0.5f));
  }
  backward(scale(nn::gpt_loss(ddp(Var(second.x)), second.y), 0.5f));
  opt.step();
  expect(calls == 2, detail::cat(what, ": the tied table's grad-ready hook fired ", calls, " times in two backwards"));
  expect_step(what, r, weights_of(model), ref);
  expect_same_on_every_rank(comm, what, weights_of(model));
}

// (c) ZeroRedundancyOptimizer (stage 1 or 2) over SGD: each rank updates its slices, the parameters all-gathered.
template <AsyncCommunicator C>
void tied_zero(C& comm, int stage, BucketConfig cfg) {
  using namespace tied;
  int const n = comm.world_size(), r = comm.rank();
  std::string const what = detail::cat("tied, ZeRO-", stage, ", ", bucket_name(cfg), ", ", n, " ranks");
  Batch const global = make_batch(kDataSeed);
  TiedLm model(kModelSeed);
  Reference const ref(weights_of(model), global, n);
  DistributedDataParallel<TiedLm, C> ddp(model, comm, {}, {.bucketer = SizeCapped{cfg}});
  expect_held_once(ddp, what, several(cfg));
  ZeroRedundancyOptimizer<optim::SGD, C> opt(ddp, {.optimizer = {.lr = kLr}, .zero = {.stage = stage}});
  one_step(ddp, opt, shard(global, r, n));
  expect_step(what, r, weights_of(model), ref);
  expect_same_on_every_rank(comm, what, weights_of(model));
}

// (d) Buckets compressed to H (bfloat16 or float16). Bound: each rank sends its gradient scaled by 1/world and
// rounded to H (relative error <= u, the unit roundoff: 2^-8 for bfloat16's 8 significant bits, 2^-11 for
// float16's 11), and the sum is rounded to H once (threads, MPI's shared memory: <= u of the sum) or after each of
// the world - 1 additions (MPI_Allreduce, Gloo: <= u of the shares' absolute sum each). So the reduced gradient of
// an element is within (world + 1) * u * sum_r |g_r| / world of the float one, g_r the ranks' shard gradients (the
// reference's, in double); the step multiplies that by lr. float16's subnormals (below 2^-14) round to 2^-25 in
// absolute terms, far inside the float tolerance the bound is added to. At one rank nothing is compressed.
template <HalfFloat H, AsyncCommunicator C>
void tied_compressed(C& comm, BucketConfig cfg) {
  using namespace tied;
  int const n = comm.world_size(), r = comm.rank();
  std::string const what = detail::cat("tied, ", H::name, " buckets, ", bucket_name(cfg), ", ", n, " ranks");
  Batch const global = make_batch(kDataSeed);
  TiedLm model(kModelSeed);
  Reference const ref(weights_of(model), global, n);
  DistributedDataParallel<TiedLm, C, SizeCapped, CompressedAllReduce<H>> ddp(model, comm, {},
                                                                             {.bucketer = SizeCapped{cfg}});
  expect_held_once(ddp, what, several(cfg));
  optim::SGD opt(ddp.parameters(), {.lr = kLr});
  one_step(ddp, opt, shard(global, r, n));
  double const u = std::same_as<H, bfloat16> ? 0x1p-8 : 0x1p-11;
  auto rounding = [&](std::vector<double> Grads::*member, std::size_t i) {
    if (n == 1) return 0.0;
    double abs_sum = 0;
    for (auto const& s : ref.shards) abs_sum += std::abs((s.*member)[i]);
    return kLr * (n + 1) * u * abs_sum / n;
  };
  expect_step(what, r, weights_of(model), ref, rounding);
  expect_same_on_every_rank(comm, what, weights_of(model));
}

namespace tied {
// Deterministic mode's step (ExactSum, MicroBatches{4}) on this rank's shard: the weights after it.
template <AsyncCommunicator C>
Weights deterministic_step(C& comm, BucketConfig cfg) {
  int const n = comm.world_size(), r = comm.rank();
  std::string const what = detail::cat("tied, deterministic, ", bucket_name(cfg), ", ", n, " ranks");
  Batch const global = make_batch(kDataSeed);
  TiedLm model(kModelSeed);
  int calls = 0;
  count_hook(model, calls);
  DeterministicDataParallel<TiedLm, C> dp(model, comm, {}, {.bucketer = SizeCapped{cfg}, .batching = {.count = 4}});
  expect_held_once(dp, what, several(cfg));
  optim::SGD opt(dp.parameters(), {.lr = kLr});
  Batch const mine = shard(global, r, n);
  opt.zero_grad();
  for (auto const& mb : dp.micro_batches(mine.x, mine.y, {.step = 0})) backward(nn::gpt_loss(dp(mb), mb.y));
  opt.step();
  expect(calls == 4 / n,
         detail::cat(what, ": the tied table's grad-ready hook fired ", calls, " times in ", 4 / n, " micro-batches"));
  return weights_of(model);
}
}  // namespace tied

// (e) Deterministic mode: the weights after the step are bitwise those of one rank with the default cap (computed
// here, on a one-rank threads group of this process), at any world size dividing 4 and any bucket plan; and within
// the float tolerance of the reference.
template <AsyncCommunicator C>
void tied_deterministic(C& comm, BucketConfig cfg) {
  using namespace tied;
  int const n = comm.world_size(), r = comm.rank();
  std::string const what = detail::cat("tied, deterministic, ", bucket_name(cfg), ", ", n, " ranks");
  Weights const got = deterministic_step(comm, cfg);
  Weights one;
  spawn(1, [&](ThreadsBackend& c) { one = deterministic_step(c, BucketConfig{}); });
  expect(got == one, detail::cat(what, ": rank ", r, ": the weights differ from one rank's, bitwise"));
  Reference const ref(weights_of(TiedLm(kModelSeed)), make_batch(kDataSeed), n);
  expect_step(what, r, got, ref);
}

// (f) Checkpoints: after one step (SGD with momentum, so the tied table's optimizer state matters) the model and
// optimizer are saved; a fresh model and optimizer (other weights) loaded from the file then take the next step
// bitwise as the run that never stopped. The file holds the table once, by its first name.
template <AsyncCommunicator C>
void tied_checkpoint(C& comm, std::filesystem::path const& file) {
  using namespace tied;
  int const n = comm.world_size(), r = comm.rank();
  std::string const what = detail::cat("tied, checkpoint, ", n, " ranks");
  Batch const b0 = make_batch(kDataSeed), b1 = make_batch(kDataSeed + 1);
  optim::SgdOptions const o{.lr = kLr, .momentum = 0.9};
  Weights straight;
  {
    TiedLm model(kModelSeed);
    DistributedDataParallel ddp(model, comm);
    optim::SGD opt(ddp.parameters(), o);
    one_step(ddp, opt, shard(b0, r, n));
    save_checkpoint(file, comm, ddp.module(), opt, TrainPosition{.step = 1, .global_step = 1});
    one_step(ddp, opt, shard(b1, r, n));
    straight = weights_of(model);
  }
  if (r == 0) {
    auto const c = read_checkpoint_file<float>(file);
    std::vector<std::string> params, state;
    for (auto const& p : c.parameters) params.push_back(p.name);
    for (auto const& p : c.optimizer.parameters) state.push_back(p.name);
    std::sort(params.begin(), params.end());
    std::sort(state.begin(), state.end());
    auto list = [](std::vector<std::string> const& names) {
      std::string s;
      for (auto const& name : names) s += (s.empty() ? "" : ", ") + name;
      return s;
    };
    std::vector<std::string> const want{"ln_f.bias", "ln_f.weight", "wte.weight"};
    expect(params == want && state == want,
           detail::cat(what, ": the checkpoint holds parameters {", list(params), "} and state for {", list(state),
                       "}; expected the tied table once, as wte.weight"));
  }
  TiedLm fresh(kModelSeed + 17);  // other initial weights: the checkpoint replaces them
  DistributedDataParallel ddp(fresh, comm);
  optim::SGD opt(ddp.parameters(), o);
  TrainPosition const at = load_checkpoint(file, comm, ddp.module(), opt);
  expect(at.global_step == 1, detail::cat(what, ": the checkpoint is at step ", at.global_step));
  expect(fresh.head.value().data() == fresh.wte.weight.value().data(), what + ": the loaded head is not the table");
  one_step(ddp, opt, shard(b1, r, n));
  expect(weights_of(fresh) == straight,
         detail::cat(what, ": rank ", r, ": the step after loading differs, bitwise, from the uninterrupted run's"));
  if (r == 0) std::filesystem::remove(file);  // load_checkpoint has read it on every rank's behalf
}

// DDP's cross-rank check counts the tied table once: rank 1 with one more token names 'wte.weight' once for each
// side of the difference (never its alias) at parameter 0; rank 1 with an untied head has one parameter more
// than the 3 the others have. World sizes of 2 or more.
template <AsyncCommunicator C>
void tied_shape_mismatch(C& comm) {
  using namespace tied;
  int const r = comm.rank();
  auto refused = [&](TiedLm& model) -> std::string {
    try {
      DistributedDataParallel ddp(model, comm);
    } catch (DdpError const& e) {
      return e.what();
    }
    throw std::runtime_error(detail::cat("rank ", r, ": a model that differs on rank 1 was accepted"));
  };
  auto count = [](std::string const& s, std::string const& what) {
    std::size_t k = 0;
    for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++k;
    return k;
  };
  {
    TiedLm model(kModelSeed, r == 1 ? kVocab + 1 : kVocab);
    std::string const m = refused(model);
    expect(m.find("at parameter 0: ") != std::string::npos && count(m, "'wte.weight'") == 2 &&
               count(m, "rank 0 has 'wte.weight' with shape [11, 8]") == 1 &&
               count(m, "rank 1 has 'wte.weight' with shape [12, 8]") == 1 && m.find("lm_head") == std::string::npos,
           "tied table of another size on rank 1: the message does not name wte.weight once per side: " + m);
  }
  {
    TiedLm model(kModelSeed, kVocab, r != 1);
    std::string const m = refused(model);
    expect(m.find("at parameter 3: rank 0 has only 3 parameters, rank 1 has 'lm_head.weight' with shape [11, 8]") !=
               std::string::npos,
           "untied head on rank 1: " + m);
  }
}

// Every tied case at this world size (ddp_suite.hpp: MpiBackend, GlooBackend). Small: 104 parameters, 8 sequences.
template <AsyncCommunicator C>
void tied_suite(C& comm) {
  int const n = comm.world_size();
  BucketConfig const several{.cap_bytes = 64, .first_cap_bytes = 16};
  tied_reference();
  for (BucketConfig cfg : {BucketConfig{}, several, BucketConfig{.cap_bytes = 0, .first_cap_bytes = 0}})
    tied_average_all_reduce(comm, cfg);
  tied_no_sync(comm);
  for (int stage : {1, 2}) tied_zero(comm, stage, several);
  for (BucketConfig cfg : {BucketConfig{}, several}) {
    tied_compressed<bfloat16>(comm, cfg);
    tied_compressed<float16>(comm, cfg);
  }
  if (4 % n == 0)
    for (BucketConfig cfg : {BucketConfig{}, several}) tied_deterministic(comm, cfg);
  char const* tmp = std::getenv("TEST_TMPDIR");
  std::filesystem::path const dir = tmp ? std::filesystem::path(tmp) : std::filesystem::temp_directory_path();
  // Only rank 0 reads and writes the file: its process id keeps runs outside bazel apart.
  tied_checkpoint(comm, dir / detail::cat("ddp_tied_", ::getpid(), "_ws", n, ".ckpt"));
  if (n > 1) tied_shape_mismatch(comm);
  if (comm.rank() == 0) std::printf("tied parameter cases passed on %d ranks\n", n);
}

}  // namespace ddp::test
