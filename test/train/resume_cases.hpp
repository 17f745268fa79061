// Resume scenarios written once over any AsyncCommunicator: train k steps, checkpoint, resume with another
// bucket plan or another world size, and compare with the uninterrupted run. Run inside doctest on the
// threads backend (resume_test.cpp) and as a plain program under mpirun -n 2 and -n 4 (resume_mpi_main.cpp).
// Each function throws std::runtime_error (or a ddp::Error) on failure.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/train/checkpoint.hpp"

namespace ddp::test::resume {

inline void expect(bool ok, std::string const& what) {
  if (!ok) throw std::runtime_error(what);
}

inline constexpr int kSteps = 6;           // the uninterrupted run
inline constexpr int kStop = 3;            // the interrupted run checkpoints after this many steps
inline constexpr std::int64_t kBatch = 8;  // global batch: every world size 1, 2, 4 takes an equal share

// One stretch of training: optimizer steps [from, to), after loading `load` (if set), then saving to `save`
// (if set). `seed` draws the initial weights and the ranks' dropout streams (seed * 1000 + rank): a resumed
// leg gets another seed, so whatever matches the uninterrupted run came from the checkpoint.
struct Leg {
  int from = 0;
  int to = kSteps;
  std::filesystem::path load{};
  std::filesystem::path save{};
  BucketConfig buckets{};
  std::uint64_t seed = 1;
};

// The bucket plans the scenarios switch between: one bucket, one per parameter, a few small ones.
inline constexpr BucketConfig kOneBucket{.cap_bytes = std::size_t{1} << 30, .first_cap_bytes = std::size_t{1} << 30};
inline constexpr BucketConfig kPerParameter{.cap_bytes = 0, .first_cap_bytes = 0};
inline constexpr BucketConfig kSmallBuckets{.cap_bytes = 256, .first_cap_bytes = 96};

// Conv, BatchNorm (buffers), Dropout (a per-rank generator), Linear: everything a checkpoint must carry.
inline auto make_cnn(std::uint64_t seed, int rank) {
  Generator g(seed);
  return nn::Sequential(
      nn::named("conv", nn::Conv2d(2, 4, 3, g)), nn::named("bn", nn::BatchNorm2d(4)), nn::ReLU(), nn::Flatten(),
      nn::named("drop", nn::Dropout(0.25, seed * 1000 + static_cast<std::uint64_t>(rank))),
      nn::named("fc1", nn::Linear(4 * 4 * 4, 16, g)), nn::Tanh(), nn::named("fc2", nn::Linear(16, 3, g)));
}
// Nothing batch-dependent but the gradient: N ranks on B/N equal one process on B (to rounding).
inline auto make_mlp(std::uint64_t seed, int /*rank*/) {
  Generator g(seed);
  return nn::Sequential(nn::named("fc1", nn::Linear(8, 32, g)), nn::Tanh(), nn::named("fc2", nn::Linear(32, 16, g)),
                        nn::Tanh(), nn::named("fc3", nn::Linear(16, 4, g)));
}

// Step `step`'s global batch (inputs of `x_shape` per sample, targets of `outs`), rows [first, first + count).
struct Batch {
  Tensor<float> x, y;
};
inline Batch batch_rows(int step, std::vector<std::int64_t> const& x_shape, std::int64_t outs, std::int64_t first,
                        std::int64_t count) {
  std::int64_t per = 1;
  for (auto d : x_shape) per *= d;
  Generator g(1000 + static_cast<std::uint64_t>(step));
  std::vector<float> xs(static_cast<std::size_t>(kBatch * per)), ys(static_cast<std::size_t>(kBatch * outs));
  for (auto& v : xs) v = g.uniform(-1.0f, 1.0f);
  for (auto& v : ys) v = g.uniform(-1.0f, 1.0f);
  std::vector<std::int64_t> dims{count};
  dims.insert(dims.end(), x_shape.begin(), x_shape.end());
  Batch b{Tensor<float>(Shape::from_range(dims.begin(), dims.end())), Tensor<float>(Shape{count, outs})};
  std::copy(xs.begin() + first * per, xs.begin() + (first + count) * per, b.x.data());
  std::copy(ys.begin() + first * outs, ys.begin() + (first + count) * outs, b.y.data());
  return b;
}

// Parameters then buffers, in the model's order: what must match bit for bit.
template <nn::Model M>
std::vector<float> state_of(M const& model) {
  std::vector<float> v;
  for (auto const& p : model.named_parameters())
    v.insert(v.end(), p.var.value().data(), p.var.value().data() + p.var.numel());
  for (auto const& b : model.named_buffers()) v.insert(v.end(), b.tensor.data(), b.tensor.data() + b.tensor.numel());
  return v;
}
inline bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
// max |a - b| / max(1, max |b|)
inline double relative_diff(std::vector<float> const& a, std::vector<float> const& b) {
  expect(a.size() == b.size(), "compared states differ in size");
  double d = 0, m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(double(a[i]) - double(b[i])));
    m = std::max(m, std::abs(double(b[i])));
  }
  return d / std::max(1.0, m);
}

template <class O>
typename O::options_type optimizer_options() {
  if constexpr (std::same_as<O, optim::SGD>)
    return {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3};
  else
    return {.lr = 0.01};
}

namespace detail {
// The training loop every leg shares: forward(step) gives the loss, load/save handle the checkpoint.
template <class O, class Forward, class Load, class Save>
void run_leg(Leg const& leg, O& opt, Forward&& forward, Load&& load, Save&& save) {
  if (!leg.load.empty()) {
    TrainPosition const pos = load(leg.load);
    expect(pos.global_step == leg.from, "checkpoint " + leg.load.string() + " is at step " +
                                            std::to_string(pos.global_step) + ", the leg starts at " +
                                            std::to_string(leg.from));
  }
  for (int s = leg.from; s < leg.to; ++s) {
    opt.zero_grad();
    backward(forward(s));
    opt.step();
  }
  if (!leg.save.empty()) save(leg.save, TrainPosition{.global_step = leg.to, .global_batch = kBatch});
}
}  // namespace detail

// A leg of `make`'s model under DDP over `comm` with optimizer O; inputs of `x_shape`, `outs` targets, MSE
// loss. Each rank takes its kBatch / world_size rows of every global batch. Returns this rank's state.
template <class O, AsyncCommunicator C, class Make>
std::vector<float> ddp_leg(C& comm, Leg const& leg, Make make, std::vector<std::int64_t> const& x_shape,
                           std::int64_t outs) {
  int const n = comm.world_size(), r = comm.rank();
  expect(kBatch % n == 0, "the global batch must divide by the world size");
  std::int64_t const local = kBatch / n;
  auto model = make(leg.seed, r);
  DistributedDataParallel ddp(model, comm, {}, {.bucketer = SizeCapped{leg.buckets}});
  O opt(ddp.parameters(), optimizer_options<O>());
  detail::run_leg(
      leg, opt,
      [&](int s) {
        auto b = batch_rows(s, x_shape, outs, r * local, local);
        return mse_loss(ddp(Var(b.x)), b.y);
      },
      [&](std::filesystem::path const& p) { return load_checkpoint(p, comm, ddp.module(), opt); },
      [&](std::filesystem::path const& p, TrainPosition pos) {
        pos.world_size = n;
        save_checkpoint(p, comm, ddp.module(), opt, pos);
      });
  return state_of(model);
}

// The same leg in one process on whole batches with a plain ParameterArena (no DDP, no communicator): the
// checkpoint goes through write_checkpoint_file / read_checkpoint_file + restore_checkpoint.
template <class O, class Make>
std::vector<float> plain_leg(Leg const& leg, Make make, std::vector<std::int64_t> const& x_shape, std::int64_t outs) {
  auto model = make(leg.seed, 0);
  nn::ParameterArena<float> arena(model);
  O opt(arena, optimizer_options<O>());
  detail::run_leg(
      leg, opt,
      [&](int s) {
        auto b = batch_rows(s, x_shape, outs, 0, kBatch);
        return mse_loss(model(Var(b.x)), b.y);
      },
      [&](std::filesystem::path const& p) {
        auto const c = read_checkpoint_file<float>(p);
        check_checkpoint_fits(c, model, opt, p.string());
        restore_checkpoint(c, model, opt);
        return c.position;
      },
      [&](std::filesystem::path const& p, TrainPosition pos) {
        pos.world_size = 1;
        write_checkpoint_file(p, capture_checkpoint(model, opt, pos));
      });
  return state_of(model);
}

inline std::vector<std::int64_t> const kCnnInput{2, 6, 6};
inline std::vector<std::int64_t> const kMlpInput{8};

// A directory every rank sees under the same name (rank 0 makes it under TEST_TMPDIR or /tmp and broadcasts
// the name): threads of one process or MPI processes on one machine.
template <Communicator C>
std::filesystem::path shared_temp_dir(C& comm, std::string const& tag) {
  std::string name;
  if (comm.rank() == 0) {
    char const* t = std::getenv("TEST_TMPDIR");
    std::string tmpl = (std::filesystem::path(t ? t : "/tmp") / (tag + ".XXXXXX")).string();
    expect(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp " + tmpl + " failed");
    name = tmpl;
  }
  std::int64_t status = 0;
  ddp::detail::broadcast_outcome(comm, 0, status, name);
  return name;
}

// Same world size, other bucket plans: k steps with one plan, checkpoint, m steps with another equal the
// uninterrupted k + m steps with the first, bit for bit (parameters and BatchNorm buffers; Dropout's streams
// continue from the file), for SGD with momentum and AdamW. Returns the largest relative difference over the
// plan pairs (0 when bitwise: the threads backend sums ranks in rank order for any plan, the optimizers'
// kernels give each element the same bits wherever the arena puts it; MPI where its sums do not depend on the
// message size).
template <AsyncCommunicator C>
double resume_with_other_buckets(C& comm, std::filesystem::path const& dir) {
  double worst = 0;
  auto one = [&]<class O>(BucketConfig first, BucketConfig second, std::string const& name) {
    auto const full = ddp_leg<O>(comm, {.buckets = first}, make_cnn, kCnnInput, 3);
    auto const ckpt = dir / (name + ".ckpt");
    auto const part = ddp_leg<O>(comm, {.to = kStop, .save = ckpt, .buckets = first}, make_cnn, kCnnInput, 3);
    expect(!same_bits(part, full), name + ": the interrupted run already equals the full one");
    auto const resumed =
        ddp_leg<O>(comm, {.from = kStop, .load = ckpt, .buckets = second, .seed = 7}, make_cnn, kCnnInput, 3);
    worst = std::max(worst, relative_diff(resumed, full));
  };
  one.template operator()<optim::AdamW>(kOneBucket, kPerParameter, "adamw_one_to_per_parameter");
  one.template operator()<optim::AdamW>(kPerParameter, kSmallBuckets, "adamw_per_parameter_to_small");
  one.template operator()<optim::SGD>(kSmallBuckets, kOneBucket, "sgd_small_to_one");
  one.template operator()<optim::AdamW>(kOneBucket, kOneBucket, "adamw_same_plan");
  return worst;
}

// Another world size: the MLP under DDP on comm's ranks and in one process with a plain arena (no DDP),
// checkpointing in one and resuming in the other, both ways, against the uninterrupted one-process run.
// Returns the largest relative difference (to 1e-6: N ranks on B/N sum the gradient in another order).
template <AsyncCommunicator C>
double resume_with_one_process(C& comm, std::filesystem::path const& dir) {
  auto const full = plain_leg<optim::AdamW>({}, make_mlp, kMlpInput, 4);
  double worst = 0;
  // comm's ranks -> one process.
  auto const a = dir / "mlp_ranks.ckpt";
  ddp_leg<optim::AdamW>(comm, {.to = kStop, .save = a, .buckets = kSmallBuckets}, make_mlp, kMlpInput, 4);
  worst = std::max(
      worst,
      relative_diff(plain_leg<optim::AdamW>({.from = kStop, .load = a, .seed = 7}, make_mlp, kMlpInput, 4), full));
  // One process -> comm's ranks (rank 0 writes; the load is collective and agreed, so others wait for it).
  auto const b = dir / "mlp_one.ckpt";
  if (comm.rank() == 0) plain_leg<optim::AdamW>({.to = kStop, .save = b}, make_mlp, kMlpInput, 4);
  comm.barrier();
  auto const resumed = ddp_leg<optim::AdamW>(comm, {.from = kStop, .load = b, .buckets = kPerParameter, .seed = 7},
                                             make_mlp, kMlpInput, 4);
  worst = std::max(worst, relative_diff(resumed, full));
  return worst;
}

}  // namespace ddp::test::resume
