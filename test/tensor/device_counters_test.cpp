// DeviceCounts (include/ddp/tensor/device_counters.hpp) on Thrust's CPU system: the choke points count what a GPU
// run would do (allocations, synchronous copies, host waits), and a training step of the main job's models, alone
// and under DDP on threads, does the same device work every step after warm-up.
//
// Issue 42 asks for zero of each per step. Without DDP a step is there: the block cache serves every
// intermediate after the first step, the loss and its gradient stay in device memory, and the class ids are
// checked by the loss kernel (device_errors.hpp). Under DDP with static_graph too: each bucket's status words
// (the desync and unused-parameter check) stay on the device after the first step; without it they go through
// the host, a copy each way. The trainer uploads each batch without a host wait (to_space_async) and reads the
// loss every loss_every steps. The bounds may only go down: a change that adds a copy, a wait or an allocation
// to the step fails here.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/tensor/device.hpp"
#include "examples/common/models.hpp"

namespace device_counters_test {

using namespace ddp;
using Dev = DeviceSpace;

// Random 28×28 images and labels on the device.
struct Batch {
  Tensor<float, Dev> x;
  Tensor<std::int32_t, Dev> y;
};
inline Batch random_batch(std::int64_t rows, std::uint64_t seed) {
  Generator g(seed);
  Tensor<float> x(Shape{rows, 1, 28, 28});
  Tensor<std::int32_t> y(Shape{rows});
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = g.uniform(0.0f, 1.0f);
  for (std::int64_t i = 0; i < rows; ++i) y[i] = static_cast<std::int32_t>(g.below(10));
  return {to_space<Dev>(x), to_space<Dev>(y)};
}

enum class Model { kMlp, kCnn };

// The counts of each of `steps` steps of `step()` (the batch is on the device before the first).
template <class Step>
std::vector<DeviceCounts> per_step(int steps, Step&& step) {
  std::vector<DeviceCounts> out;
  for (int s = 0; s < steps; ++s) {
    auto const before = device_counts();
    step(s);
    out.push_back(device_counts() - before);
  }
  return out;
}

// `steps` AdamW steps of `net` through `forward` (the model, or DDP over it) on rank `rank`'s batch.
template <class Net, class Forward, class Params>
std::vector<DeviceCounts> train(Net& net, Forward& forward, Params& params, int rank, int steps) {
  Batch const b = random_batch(16, 7 + static_cast<std::uint64_t>(rank));
  optim::basic_adamw<float, Dev> opt(params, {.lr = 1e-3});
  return per_step(steps, [&](int s) {
    examples::reseed_dropouts(net, 1, rank, 0, s);
    opt.zero_grad();
    Variable<float, Dev> loss = cross_entropy(forward(Variable<float, Dev>(b.x)), b.y);
    backward(loss);
    opt.step();
  });
}

inline examples::Net<Dev> make(Model m) {
  Generator init(1);
  return m == Model::kCnn ? examples::make_cnn<Dev>(init) : examples::make_mlp<Dev>(init);
}

inline std::vector<DeviceCounts> train_alone(Model m, int steps) {
  auto net = make(m);
  nn::ParameterArena<float, Dev> arena(net.seq);
  return train(net, net.seq, arena, 0, steps);
}

template <class Comm>
std::vector<DeviceCounts> train_ddp(Model m, Comm& comm, int steps, DdpOptions opts) {
  auto net = make(m);
  DistributedDataParallel ddp(net.seq, comm, opts);
  return train(net, ddp, ddp.parameters(), comm.rank(), steps);
}

inline std::string name(Model m) { return m == Model::kCnn ? "cnn" : "mlp"; }

}  // namespace device_counters_test

TEST_CASE("device counters: each choke point counts once, with its bytes") {
  using device_counters_test::Dev;
  using K = ddp::Kernels<Dev>;
  std::int64_t const n = 123'457;  // a size no other test of this binary frees: the cache cannot serve it
  auto const before = ddp::device_counts();
  {
    ddp::Tensor<float, Dev> t(ddp::Shape{n});  // one allocation, rounded up to 512 bytes
    std::vector<float> host(static_cast<std::size_t>(n), 1.0f);
    K::from_host(n, host.data(), t.data());  // one synchronous copy
    float const s = K::sum(n, t.data());     // one host wait
    K::to_host(n, t.data(), host.data());    // another copy
    CHECK(s == static_cast<float>(n));
  }
  auto const d = ddp::device_counts() - before;
  CHECK(d.allocations == 1);
  CHECK(d.allocated_bytes == 494'080);  // 493 828 bytes, rounded up
  CHECK(d.sync_copies == 2);
  CHECK(d.copied_bytes == 2 * 493'828);
  CHECK(d.host_waits == 1);
  CHECK(d.describe() == "1 allocation (494.08 kB), 2 synchronous copies (987.656 kB), 1 host wait");

  // The freed block serves the next tensor of its size (or any size that rounds to it): nothing is allocated.
  auto const again = ddp::device_counts();
  { ddp::Tensor<float, Dev> t(ddp::Shape{n - 10}); }
  CHECK((ddp::device_counts() - again).allocations == 0);

  // Per thread: another thread's work is not this one's.
  auto const mine = ddp::device_counts();
  std::thread([] { ddp::Tensor<float, Dev> other(ddp::Shape{10}); }).join();
  CHECK(ddp::device_counts() == mine);
}

TEST_CASE("device counters: after warm-up every training step does the same device work, within today's bound") {
  using namespace device_counters_test;
  // The counts per step (AdamW, batch 16 per rank), the bound each step must stay within. Without static_graph,
  // DDP reads its status words on the host: one copy to the device and one back per bucket (the MLP has 1, the
  // CNN 2). With it, nothing after the first step.
  struct Bound {
    Model model;
    int world_size;  // 0: no DDP
    bool static_graph;
    std::uint64_t allocations, sync_copies, host_waits;
  };
  Bound const bounds[] = {{Model::kMlp, 0, false, 0, 0, 0}, {Model::kCnn, 0, false, 0, 0, 0},
                          {Model::kMlp, 2, false, 0, 2, 0}, {Model::kCnn, 2, false, 0, 4, 0},
                          {Model::kMlp, 2, true, 0, 0, 0},  {Model::kCnn, 2, true, 0, 0, 0},
                          {Model::kMlp, 4, true, 0, 0, 0},  {Model::kCnn, 4, true, 0, 0, 0}};
  for (auto const& bound : bounds) {
    CAPTURE(name(bound.model));
    CAPTURE(bound.world_size);
    CAPTURE(bound.static_graph);
    std::vector<std::vector<DeviceCounts>> counts;
    if (bound.world_size == 0) {
      counts.push_back(train_alone(bound.model, 4));
    } else {
      counts.resize(static_cast<std::size_t>(bound.world_size));
      ddp::spawn(bound.world_size, [&](ddp::ThreadsBackend& comm) {
        counts[static_cast<std::size_t>(comm.rank())] =
            train_ddp(bound.model, comm, 4, {.static_graph = bound.static_graph});
      });
    }
    for (auto const& rank : counts) {
      REQUIRE(rank.size() == 4);
      std::string const what = name(bound.model) + (bound.world_size ? " under DDP" : "") +
                               (bound.static_graph ? " (static_graph)" : "") +
                               ", a step after warm-up: " + rank[3].describe();
      MESSAGE(what);
      CHECK(rank[2] == rank[3]);  // the steady state: the same work every step
      CHECK(rank[3].allocations <= bound.allocations);
      CHECK(rank[3].sync_copies <= bound.sync_copies);
      CHECK(rank[3].host_waits <= bound.host_waits);
    }
  }
}

TEST_CASE(
    "device counters: a trainer step on device tensors, after warm-up, is two asynchronous uploads and no "
    "host work") {
  using namespace device_counters_test;
  std::int64_t const per_rank = 16, steps = 10;
  Generator g(21);
  Tensor<float> x(Shape{2 * per_rank * steps, 1, 28, 28});
  Tensor<std::int32_t> y(Shape{2 * per_rank * steps});
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = g.uniform(0.0f, 1.0f);
  for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = static_cast<std::int32_t>(g.below(10));
  TensorDataset<std::int32_t> data(x, y);
  for (Model m : {Model::kMlp, Model::kCnn}) {
    CAPTURE(name(m));
    std::vector<std::vector<DeviceCounts>> counts(2);
    ddp::spawn(2, [&](ddp::ThreadsBackend& comm) {
      auto net = make(m);
      basic_trainer<nn::AnySequential<float, Dev>, ThreadsBackend, optim::basic_adamw<float, Dev>> t(
          net.seq, comm, {.lr = 1e-3},
          {.batch_size = per_rank, .seed = 3, .ddp = {.static_graph = true}, .loss_every = 8});
      auto& mine = counts[static_cast<std::size_t>(comm.rank())];
      DeviceCounts before;
      StepHooks hooks{.before_step = [&](StepPosition const&) { before = device_counts(); },
                      .after_step =
                          [&](StepPosition const&, double) {
                            mine.push_back(device_counts() - before);
                            return StepControl::kContinue;
                          }};
      auto const ce = [](Variable<float, Dev> const& out, auto const& b) { return cross_entropy(out, b.y); };
      auto const r = t.fit_epoch(data, EpochStart{}, ce, hooks);
      CHECK(std::isfinite(r.train.mean_loss()));
    });
    for (auto const& rank : counts) {
      REQUIRE(rank.size() == static_cast<std::size_t>(steps));
      std::string const what = name(m) + " in basic_trainer, step 3: " + rank[3].describe();
      MESSAGE(what);
      for (std::size_t s = 2; s < 7; ++s) {  // step 7 reads the 8 losses: one copy
        CAPTURE(s);
        CHECK(rank[s].allocations == 0);
        CHECK(rank[s].sync_copies == 0);
        CHECK(rank[s].host_waits == 0);
        CHECK(rank[s].async_copies == 2);  // the inputs and the targets
        CHECK(rank[s].async_bytes == per_rank * (28 * 28 * 4 + 4));
      }
      CHECK(rank[7].sync_copies == 1);
      CHECK(rank[7].copied_bytes == 8 * 4);
    }
  }
}
