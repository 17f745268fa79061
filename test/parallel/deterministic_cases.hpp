// Shared by the deterministic-mode tests (threads inside doctest, and under mpirun): train the MLP or the CNN
// (with dropout) for a few steps with DistributedDataParallel in deterministic mode (ExactSum, MicroBatches) on
// any communicator and return the raw bytes of the final weights, so that runs at different world sizes and
// bucket caps can be compared bit for bit.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ddp/data/global_batch_sampler.hpp"
#include "ddp/ddp.hpp"
#include "ddp/parallel/deterministic.hpp"
#include "ddp/train/checkpoint.hpp"

namespace det_cases {

using namespace ddp;

inline constexpr std::int64_t kSamples = 64;
inline constexpr std::int64_t kGlobalBatch = 16;
inline constexpr std::int64_t kMicroBatches = 4;  // world sizes 1, 2 and 4 divide it

enum class ModelKind { kMlp, kCnn };
enum class OptKind { kSgdMomentum, kAdamW };

struct Run {
  ModelKind model = ModelKind::kMlp;
  OptKind optimizer = OptKind::kSgdMomentum;
  std::size_t cap_bytes = kDefaultBucketCapBytes;
  std::int64_t steps = 3;
  // Rank r's dropout layers seeded with r * this added (the per-rank seeding plain DDP invites): deterministic mode
  // makes them rank 0's at construction, so the result must not change.
  std::uint64_t dropout_seed_per_rank = 0;
  // ZeRO stage of the optimizer (ZeroRedundancyOptimizer; 0: the optimizer itself): the bytes must not change.
  int zero = 0;
  // kBucketReduced: under OverlappedOptimizer, each bucket updated as it lands: the bytes must not change.
  UpdateAt update = UpdateAt::kStep;
};

inline std::string describe(Run const& r) {
  return detail::cat(r.model == ModelKind::kMlp ? "mlp" : "cnn", "/",
                     r.optimizer == OptKind::kSgdMomentum ? "sgd+momentum" : "adamw", "/cap=", r.cap_bytes,
                     "/steps=", r.steps, r.zero ? detail::cat("/zero=", r.zero) : std::string(),
                     r.update == UpdateAt::kBucketReduced ? "/overlapped" : "");
}

// A small MLP (with dropout) and a small CNN with both dropouts of BasicNet; different seeds per dropout, each
// plus `seed_offset`.
inline nn::AnySequential<float> make_model(ModelKind kind, std::uint64_t seed_offset = 0) {
  Generator g(42);
  nn::AnySequential<float> m;
  if (kind == ModelKind::kMlp) {
    m.push_back(nn::Flatten());
    m.push_back("fc1", nn::Linear(64, 32, g)).push_back(nn::ReLU()).push_back(nn::Dropout(0.2, 11 + seed_offset));
    m.push_back("fc2", nn::Linear(32, 10, g));
  } else {
    m.push_back("conv1", nn::Conv2d(1, 4, 3, g)).push_back(nn::ReLU());
    m.push_back("conv2", nn::Conv2d(4, 8, 3, g)).push_back(nn::ReLU());
    m.push_back(nn::MaxPool2d(2)).push_back(nn::Dropout(0.25, 21 + seed_offset)).push_back(nn::Flatten());
    m.push_back("fc1", nn::Linear(8 * 2 * 2, 16, g))
        .push_back(nn::ReLU())
        .push_back(nn::Dropout(0.5, 22 + seed_offset));
    m.push_back("fc2", nn::Linear(16, 10, g));
  }
  return m;
}

// The dataset, the same on every rank: 64 inputs of 1x8x8 and labels.
struct Data {
  Tensor<float> x{Shape{kSamples, 1, 8, 8}};
  Tensor<std::int32_t> y{Shape{kSamples}};
  Data() {
    Generator g(7);
    for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = g.uniform(-1.0f, 1.0f);
    for (std::int64_t i = 0; i < kSamples; ++i) y[i] = static_cast<std::int32_t>(g.below(10));
  }
};

template <class Opt>
struct Trained {
  std::vector<std::uint8_t> bytes;          // the final weights, in named_parameters order
  std::optional<CheckpointData<float>> at;  // the checkpoint taken after `checkpoint_after` steps
};

inline std::vector<std::uint8_t> weight_bytes(nn::AnySequential<float> const& m) {
  std::vector<std::uint8_t> out;
  for (auto const& p : m.named_parameters()) {
    auto const* b = reinterpret_cast<std::uint8_t const*>(p.var.value().data());
    out.insert(out.end(), b, b + p.var.numel() * sizeof(float));
  }
  return out;
}

// Trains steps [first, run.steps) of epoch-ordered global batches (shuffled by seed 3). With `resume`,
// the model and optimizer start from it; with checkpoint_after >= 0, a checkpoint is captured then.
template <class Comm>
std::vector<std::uint8_t> train(Comm& comm, Run const& run, CheckpointData<float> const* resume = nullptr,
                                std::int64_t checkpoint_after = -1, CheckpointData<float>* captured = nullptr) {
  Data const data;
  auto model = make_model(run.model, static_cast<std::uint64_t>(comm.rank()) * run.dropout_seed_per_rank);
  DeterministicDataParallel<nn::AnySequential<float>, Comm> dp(
      model, comm, {},
      {.bucketer = SizeCapped{{.cap_bytes = run.cap_bytes, .first_cap_bytes = run.cap_bytes}},
       .batching = {.count = kMicroBatches}});
  // A sharded optimizer's state is put together on every rank (collective); rank 0 keeps the checkpoint.
  auto take = [&](auto const& opt, std::int64_t step) {
    TrainPosition const at{.global_step = step};
    if constexpr (requires { opt.consolidated_state(); }) {
      auto full = opt.consolidated_state();
      if (captured) *captured = capture_checkpoint(model, std::move(full), at);
    } else if (captured) {
      *captured = capture_checkpoint(model, opt, at);
    }
  };
  auto body = [&](auto& opt) {
    std::int64_t first = 0;
    if (resume) {
      restore_checkpoint(*resume, model, opt);
      first = resume->position.global_step;
    }
    GlobalBatchSampler sampler(kSamples, kGlobalBatch, comm, {.seed = 3});
    std::int64_t const per_epoch = sampler.batches(), share = sampler.local_batch();
    for (std::int64_t s = first; s < run.steps; ++s) {
      if (s == checkpoint_after) take(opt, s);
      sampler.set_epoch(s / per_epoch);
      auto idx =
          sampler.indices().subspan(static_cast<std::size_t>((s % per_epoch) * share), static_cast<std::size_t>(share));
      Tensor<float> x(Shape{share, 1, 8, 8});
      Tensor<std::int32_t> y(Shape{share});
      for (std::int64_t i = 0; i < share; ++i) {
        std::int64_t const k = idx[static_cast<std::size_t>(i)];
        std::memcpy(x.data() + i * 64, data.x.data() + k * 64, 64 * sizeof(float));
        y[i] = data.y[k];
      }
      opt.zero_grad();
      for (auto const& mb : dp.micro_batches(x, y, {.step = static_cast<std::uint64_t>(s)}))
        backward(cross_entropy(dp(mb), mb.y));
      opt.step();
    }
    if (checkpoint_after == run.steps) take(opt, run.steps);
  };
  optim::SgdOptions const sgd{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4};
  optim::AdamWOptions const adamw{.lr = 1e-2, .weight_decay = 0.01};
  auto with = [&]<class O>(std::type_identity<O>, typename O::options_type const& o) {
    if (run.update == UpdateAt::kBucketReduced) {
      OverlappedOptimizer<O> opt(dp, {.optimizer = o});
      if (!opt.updates_in_backward())
        throw std::runtime_error("OverlappedOptimizer did not attach: " + opt.waits_for());
      body(opt);
    } else {
      O opt = detail::make_optimizer<O>(dp, o);
      body(opt);
    }
  };
  if (run.zero != 0 && run.optimizer == OptKind::kSgdMomentum)
    with(std::type_identity<ZeroRedundancyOptimizer<optim::SGD, Comm>>{},
         {.optimizer = sgd, .zero = {.stage = run.zero}});
  else if (run.zero != 0)
    with(std::type_identity<ZeroRedundancyOptimizer<optim::AdamW, Comm>>{},
         {.optimizer = adamw, .zero = {.stage = run.zero}});
  else if (run.optimizer == OptKind::kSgdMomentum)
    with(std::type_identity<optim::SGD>{}, sgd);
  else
    with(std::type_identity<optim::AdamW>{}, adamw);
  return weight_bytes(model);
}

// FNV-1a of the bytes, for runs compared across processes.
inline std::uint64_t digest(std::vector<std::uint8_t> const& b) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::uint8_t c : b) h = (h ^ c) * 1099511628211ull;
  return h;
}

inline std::vector<Run> all_runs() {
  std::vector<Run> runs;
  for (auto m : {ModelKind::kMlp, ModelKind::kCnn})
    for (auto o : {OptKind::kSgdMomentum, OptKind::kAdamW})
      for (std::size_t cap : {std::size_t{1} << 10, std::size_t{1} << 20, std::size_t{25} << 20})
        runs.push_back({.model = m, .optimizer = o, .cap_bytes = cap, .steps = 5});
  // ZeRO-1 with several buckets, each cut into world_size slices.
  for (auto m : {ModelKind::kMlp, ModelKind::kCnn})
    for (auto o : {OptKind::kSgdMomentum, OptKind::kAdamW})
      runs.push_back({.model = m, .optimizer = o, .cap_bytes = std::size_t{1} << 10, .steps = 5, .zero = 1});
  // The update overlapped with the bucket reductions, alone and over ZeRO-1.
  for (auto m : {ModelKind::kMlp, ModelKind::kCnn})
    for (int zero : {0, 1})
      runs.push_back({.model = m,
                      .optimizer = zero ? OptKind::kAdamW : OptKind::kSgdMomentum,
                      .cap_bytes = std::size_t{1} << 10,
                      .steps = 5,
                      .zero = zero,
                      .update = UpdateAt::kBucketReduced});
  return runs;
}

// ---- Misuse: each is the same clear error on every rank (or, for per-rank seeds, made harmless). ----

inline void det_expect(bool ok, std::string const& what) {
  if (!ok) throw std::runtime_error(what);
}

// Runs `body` and expects it to throw E whose message contains `want`, on this rank.
template <class E, class Body>
void expect_error(int rank, std::string const& what, std::string const& want, Body&& body) {
  try {
    body();
  } catch (E const& e) {
    std::string const m = e.what();
    det_expect(m.find(want) != std::string::npos,
               detail::cat("rank ", rank, ": ", what, ": the message lacks '", want, "': ", m));
    return;
  }
  throw std::runtime_error(detail::cat("rank ", rank, ": ", what, " was not refused"));
}

template <class Comm>
using Det = DeterministicDataParallel<nn::AnySequential<float>, Comm>;

// A batch of `rows` rows from Data (the same rows on every rank; only their number matters here).
inline std::pair<Tensor<float>, Tensor<std::int32_t>> some_rows(std::int64_t rows) {
  Data const d;
  Tensor<float> x(Shape{rows, 1, 8, 8});
  Tensor<std::int32_t> y(Shape{rows});
  std::memcpy(x.data(), d.x.data(), static_cast<std::size_t>(x.numel()) * sizeof(float));
  std::memcpy(y.data(), d.y.data(), static_cast<std::size_t>(rows) * sizeof(std::int32_t));
  return {x, y};
}

// Ranks whose shares of the global batch differ in rows (rank 0 has twice the others'), and a share that is not a
// whole number of micro-batches: ShapeErrors on every rank, before any forward.
template <class Comm>
void unequal_rows(Comm& comm) {
  int const r = comm.rank(), n = comm.world_size();
  auto model = make_model(ModelKind::kMlp);
  Det<Comm> dp(model, comm, {}, {.batching = {.count = 4}});
  std::int64_t const per = 4 / n;
  if (n > 1) {
    auto [x, y] = some_rows(r == 0 ? 4 * per : 2 * per);
    expect_error<ShapeError>(r, "unequal rows", "the ranks' batches differ in rows (rank 0 has",
                             [&] { dp.micro_batches(x, y, {.step = 0}); });
  }
  auto [x, y] = some_rows(2 * per + 1);  // one row too many for per equal micro-batches
  if (per > 1)
    expect_error<ShapeError>(r, "a batch of whole micro-batches", "equal micro-batches",
                             [&] { dp.micro_batches(x, y, {.step = 0}); });
}

// The ranks pass different steps (rank 1 one ahead): a DdpError on every rank naming the steps.
template <class Comm>
void mismatched_step(Comm& comm) {
  int const r = comm.rank();
  auto model = make_model(ModelKind::kMlp);
  Det<Comm> dp(model, comm, {}, {.batching = {.count = 4}});
  auto [x, y] = some_rows(4 / comm.world_size() * 2);
  expect_error<DdpError>(r, "mismatched steps", "the ranks passed different steps (rank 0 step 7, rank 1 step 8",
                         [&] { dp.micro_batches(x, y, {.step = r == 1 ? 8u : 7u}); });
}

// Dropout reseeded with the rank after construction (plain DDP's advice): a DdpError on every rank naming the
// generator. Seeded with the rank before construction: made rank 0's, so the training is unchanged (bitwise).
template <class Comm>
void per_rank_dropout_seeds(Comm& comm) {
  int const r = comm.rank();
  Run const same{.model = ModelKind::kCnn, .steps = 2};
  Run differing = same;
  differing.dropout_seed_per_rank = 1000;
  det_expect(train(comm, differing) == train(comm, same),
             detail::cat("rank ", r, ": dropout seeded per rank at construction changed the deterministic result"));
  if (comm.world_size() == 1) return;
  auto model = make_model(ModelKind::kMlp);
  Det<Comm> dp(model, comm, {}, {.batching = {.count = 4}});
  for (auto const& g : nn::generators_of(model)) g.generator->seed(11 + static_cast<std::uint64_t>(r));
  auto [x, y] = some_rows(4 / comm.world_size() * 2);
  expect_error<DdpError>(r, "dropout reseeded per rank", "the model's random generators differ across ranks ('",
                         [&] { dp.micro_batches(x, y, {.step = 0}); });
}

// BatchNorm in training mode updates its running statistics from each rank's own micro-batches: a DdpError on
// every rank naming the buffers, after the step's forwards and before its reduction. In evaluation mode it trains.
template <class Comm>
void batch_norm_in_training(Comm& comm) {
  int const r = comm.rank();
  auto make = [] {
    Generator g(5);
    nn::AnySequential<float> m;
    m.push_back("conv", nn::Conv2d(1, 2, 3, g)).push_back("bn", nn::BatchNorm2d(2)).push_back(nn::Flatten());
    m.push_back("fc", nn::Linear(2 * 6 * 6, 10, g));
    return m;
  };
  auto [x, y] = some_rows(4 / comm.world_size() * 2);
  {
    auto model = make();
    Det<Comm> dp(model, comm, {}, {.batching = {.count = 4}});
    expect_error<DdpError>(r, "BatchNorm in training mode", "the model's buffers ('bn.running_mean', 'bn.running_var'",
                           [&] {
                             for (auto const& mb : dp.micro_batches(x, y, {.step = 0}))
                               backward(cross_entropy(dp(mb), mb.y));
                           });
  }
  auto model = make();
  model.set_mode(Mode::kEval);
  Det<Comm> dp(model, comm, {}, {.batching = {.count = 4}});
  for (auto const& mb : dp.micro_batches(x, y, {.step = 0})) backward(cross_entropy(dp(mb), mb.y));
  det_expect(dp.parameters().all_grads_defined(), detail::cat("rank ", r, ": BatchNorm in eval mode did not train"));
}

}  // namespace det_cases
