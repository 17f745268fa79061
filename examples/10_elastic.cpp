// 10_elastic: in-place elastic training on the threads backend (README "Elastic training"). Four ranks train a small
// classifier in deterministic mode; rank 2 throws std::bad_alloc before step 5, so the others go on at world size 3
// from step 5's start (kept in memory); at step 10 a new rank joins, and the job ends at world size 4. The final
// weights are compared with a run that never changed: the same bits. Exits 1 if they differ.
#include <ddp/ddp.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <new>
#include <thread>

#include "examples/common/report.hpp"

using namespace ddp;

namespace {

// 384 samples of 4 features in 3 classes (class c raises feature c).
TensorDataset<std::int32_t> make_data() {
  Generator g(7);
  Tensor<float> x(Shape{384, 4});
  Tensor<std::int32_t> y(Shape{384});
  for (std::int64_t i = 0; i < 384; ++i) {
    y[i] = static_cast<std::int32_t>(g.below(3));
    for (int j = 0; j < 4; ++j) x[i * 4 + j] = g.uniform(-0.5f, 0.5f) + (j == y[i] ? 1.5f : 0.0f);
  }
  return TensorDataset<std::int32_t>(x, y);
}

auto make_model() {
  Generator g(11);  // the same initial weights on every rank
  return nn::Sequential(nn::Linear(4, 32, g), nn::ReLU(), nn::Linear(32, 3, g));
}
using Model = decltype(make_model());
// 12 micro-batches of 2 per step: the same bits at every world size dividing 12. 384 / 24 = 16 steps an epoch.
using Trainer = basic_trainer<Model, ThreadsBackend, optim::AdamW, SizeCapped, ExactSum, MicroBatches>;

// `at(first_rank, step, session)` runs before each step: the scenario's faults and joins.
template <class At>
std::string train(TensorDataset<std::int32_t> const& data, int world_size, ElasticOptions opts, At const& at) {
  std::string digest;
  std::atomic<bool> joining{false};
  ElasticThreads job(
      world_size,
      [&](ThreadsBackend& comm, ElasticSession& session) {
        auto model = make_model();
        Trainer t(model, comm, {.lr = 0.01}, {.seed = 3, .global_batch = 24}, {.batching = {.count = 12}});
        TrainPosition pos;
        if (auto p = t.resume_kept(session)) pos = *p;  // after a change: the interrupted step's start
        for (std::int64_t epoch = pos.epoch; epoch < 2; ++epoch) {
          auto const r = t.fit_epoch(
              data, {.epoch = epoch, .step = epoch == pos.epoch ? pos.step : 0, .global_step = pos.global_step},
              [](Var const& out, auto const& mb) { return cross_entropy(out, mb.y); },
              {.before_step =
                   [&](StepPosition const& p) {
                     at(session.first_rank(), p.global_step, session, joining);
                     t.elastic_step(session, p);
                   },
               .after_step = {}});
          pos.global_step = r.global_step;
        }
        if (comm.rank() == 0) digest = examples::weights_digest(model);
      },
      opts);
  if (opts.max_world_size > 0) {  // the scenario adds a rank: once `at` holds the step it should join at
    while (!joining) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    job.add_rank();  // joins at the next step boundary
  }
  auto const report = job.wait();  // report.changes: who was lost or joined, at which step, how long it took
  std::printf("%zu membership change%s, final world size %d\n", report.changes.size(),
              report.changes.size() == 1 ? "" : "s", report.final_world_size);
  return digest;
}

}  // namespace

int main() {
  auto const data = make_data();
  std::printf("uninterrupted, 4 ranks:\n");
  auto const whole = train(data, 4, {}, [](int, std::int64_t, ElasticSession&, std::atomic<bool>&) {});
  std::printf("weights: %s\n\nrank 2 fails before step 5, a rank joins at step 10:\n", whole.c_str());
  auto const changed = train(data, 4, {.min_world_size = 2, .max_world_size = 4},
                             [](int first, std::int64_t step, ElasticSession& session, std::atomic<bool>& joining) {
                               if (first == 2 && step == 5) throw std::bad_alloc();
                               if (first == 0 && step == 10 && session.generation() == 1) {
                                 joining = true;  // hold step 10 until the new rank has asked to join
                                 while (session.joiners_waiting() == 0)
                                   std::this_thread::sleep_for(std::chrono::milliseconds(1));
                               }
                             });
  std::printf("weights: %s (%s)\n", changed.c_str(), changed == whole ? "bitwise the uninterrupted run's" : "DIFFER");
  return changed == whole ? 0 : 1;
}
