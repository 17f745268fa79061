// Shared by the deterministic-mode tests (threads inside doctest, and under mpirun): train the MLP or the CNN
// (with dropout) for a few steps with DeterministicDataParallel on any communicator and return the raw bytes
// of the final weights, so that runs at different world sizes and bucket caps can be compared bit for bit.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
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
};

inline std::string describe(Run const& r) {
  return detail::cat(r.model == ModelKind::kMlp ? "mlp" : "cnn", "/",
                     r.optimizer == OptKind::kSgdMomentum ? "sgd+momentum" : "adamw", "/cap=", r.cap_bytes,
                     "/steps=", r.steps);
}

// A small MLP (with dropout) and a small CNN with both dropouts of BasicNet; different seeds per dropout.
inline nn::AnySequential<float> make_model(ModelKind kind) {
  Generator g(42);
  nn::AnySequential<float> m;
  if (kind == ModelKind::kMlp) {
    m.push_back(nn::Flatten());
    m.push_back("fc1", nn::Linear(64, 32, g)).push_back(nn::ReLU()).push_back(nn::Dropout(0.2, 11));
    m.push_back("fc2", nn::Linear(32, 10, g));
  } else {
    m.push_back("conv1", nn::Conv2d(1, 4, 3, g)).push_back(nn::ReLU());
    m.push_back("conv2", nn::Conv2d(4, 8, 3, g)).push_back(nn::ReLU());
    m.push_back(nn::MaxPool2d(2)).push_back(nn::Dropout(0.25, 21)).push_back(nn::Flatten());
    m.push_back("fc1", nn::Linear(8 * 2 * 2, 16, g)).push_back(nn::ReLU()).push_back(nn::Dropout(0.5, 22));
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
  auto model = make_model(run.model);
  DeterministicDataParallel dp(model, comm, {.micro_batches = kMicroBatches},
                               SizeCapped{{.cap_bytes = run.cap_bytes, .first_cap_bytes = run.cap_bytes}});
  auto body = [&](auto& opt) {
    std::int64_t first = 0;
    if (resume) {
      restore_checkpoint(*resume, model, opt);
      first = resume->position.global_step;
    }
    GlobalBatchSampler sampler(kSamples, kGlobalBatch, comm, {.seed = 3});
    std::int64_t const per_epoch = sampler.batches(), share = sampler.local_batch();
    for (std::int64_t s = first; s < run.steps; ++s) {
      if (s == checkpoint_after && captured)
        *captured = capture_checkpoint(model, opt, TrainPosition{.global_step = s});
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
      dp.compute_gradients(static_cast<std::uint64_t>(s), x, y,
                           [](Var const& out, Tensor<std::int32_t> const& t) { return cross_entropy(out, t); });
      opt.step();
    }
    if (checkpoint_after == run.steps && captured)
      *captured = capture_checkpoint(model, opt, TrainPosition{.global_step = run.steps});
  };
  if (run.optimizer == OptKind::kSgdMomentum) {
    optim::SGD opt(dp.parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
    body(opt);
  } else {
    optim::AdamW opt(dp.parameters(), {.lr = 1e-2, .weight_decay = 0.01});
    body(opt);
  }
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
  return runs;
}

}  // namespace det_cases
