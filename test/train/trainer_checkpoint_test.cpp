// basic_trainer's save_checkpoint / load_checkpoint carry what the loop keeps between steps besides the model and
// the optimizer (train/checkpoint.hpp's RoundState): PowerSGD's round counts, Q and every rank's error feedback, and
// the loss scale. A run resumed mid-epoch from them is bitwise the uninterrupted run; without them it is not.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "ddp/ddp.hpp"
#include "test/train/testing.hpp"

using namespace ddp;

namespace trainer_checkpoint_test {

inline std::vector<float> weights(nn::ParameterArena<float> const& a) {
  std::vector<float> v;
  for (auto const& p : a.entries()) v.insert(v.end(), p.var.value().data(), p.var.value().data() + p.numel);
  return v;
}

// Three buckets of the blobs MLP under PowerSGD at rank 1, compressing from the third round of each bucket.
using Model = decltype(test::make_blobs_model());
using PowerTrainer = basic_trainer<Model, ThreadsBackend, optim::SGD, SizeCapped, PowerSgd>;
inline constexpr PowerSgdOptions kPowerSgd{.rank = 1, .warmup_steps = 2, .min_compression_rate = 1.0};

inline PowerTrainer make_trainer(Model& m, ThreadsBackend& comm, std::size_t cap_bytes = 64) {
  return PowerTrainer(
      m, comm, {.lr = 0.1, .momentum = 0.9}, {.batch_size = 8, .seed = 3},
      {.bucketer = SizeCapped{{.cap_bytes = cap_bytes, .first_cap_bytes = cap_bytes}}, .reduction = {kPowerSgd}});
}

inline auto ce() {
  return [](Var const& out, auto const& batch) { return cross_entropy(out, batch.y); };
}

// Epoch 0 from `step` to its end, then epoch 1; returns this rank's weights.
template <class Trainer, class D>
std::vector<float> finish(Trainer& t, D const& data, TrainPosition const& pos) {
  t.fit_epoch(data, EpochStart{.epoch = 0, .step = pos.step, .global_step = pos.global_step}, ce(), {});
  t.fit_epoch(data, EpochStart{.epoch = 1, .global_step = pos.global_step}, ce(), {});
  return weights(t.ddp().parameters());
}

}  // namespace trainer_checkpoint_test

TEST_CASE("trainer checkpoint: a PowerSGD run resumed mid-epoch continues bitwise (Q, error feedback, round counts)") {
  using namespace trainer_checkpoint_test;
  auto const data = test::blobs(103, 1);
  auto const dir = test::temp_dir("trainer_checkpoint", "powersgd");
  auto const file = dir / "ckpt.bin";
  std::vector<std::vector<float>> whole(2), resumed(2), stateless(2);
  spawn(2, [&](ThreadsBackend& comm) {
    auto const r = static_cast<std::size_t>(comm.rank());
    {  // uninterrupted: 2 epochs of 6 steps
      Model m = test::make_blobs_model();
      auto t = make_trainer(m, comm);
      REQUIRE(t.ddp().plan().buckets.size() == 3);
      whole[r] = finish(t, data, {});
      CHECK(t.ddp().wire_state().kind == "powersgd");
    }
    {  // 4 steps, checkpoint; the state then holds compressed rounds (warm-up was 2)
      Model m = test::make_blobs_model();
      auto t = make_trainer(m, comm);
      t.fit_epoch(data, EpochStart{.epoch = 0}, ce(),
                  {.before_step = {}, .after_step = [&](StepPosition const& p, double) {
                     if (p.step < 4) return StepControl::kContinue;
                     t.save_checkpoint(file, {.epoch = 0, .step = p.step, .global_step = p.global_step});
                     return StepControl::kStop;
                   }});
      auto const st = t.ddp().wire_state();
      // Per bucket: rounds, and whether Q was drawn (the middle bucket, a bias alone, has no matrix to compress).
      CHECK(st.counters == std::vector<std::int64_t>{4, 1, 4, 0, 4, 1});
    }
    {  // a new trainer resumes from the file
      Model m = test::make_blobs_model();
      auto t = make_trainer(m, comm);
      TrainPosition const pos = t.load_checkpoint(file);
      CHECK(pos.step == 4);
      CHECK(t.ddp().wire_state().counters == std::vector<std::int64_t>{4, 1, 4, 0, 4, 1});
      resumed[r] = finish(t, data, pos);
    }
    {  // the model and optimizer alone (what checkpoints held before): PowerSGD starts over, and the run differs
      Model m = test::make_blobs_model();
      auto t = make_trainer(m, comm);
      TrainPosition const pos = load_checkpoint(file, comm, t.ddp().module(), t.optimizer());
      stateless[r] = finish(t, data, pos);
    }
    {  // the same wire in another bucket layout: refused on every rank, naming what to keep
      Model m = test::make_blobs_model();
      auto t = make_trainer(m, comm, std::size_t{1} << 20);
      CHECK_THROWS_WITH_AS(t.load_checkpoint(file), doctest::Contains("another bucket layout"), ArgumentError);
    }
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(resumed[r] == whole[r]);
    CHECK(stateless[r] != whole[r]);
  }
  CHECK(whole[0] == whole[1]);
  std::filesystem::remove_all(dir);
}

TEST_CASE("trainer checkpoint: the loss scale and its growth tracker are restored; a file without them keeps init") {
  using namespace trainer_checkpoint_test;
  auto const data = test::blobs(103, 1);
  auto const dir = test::temp_dir("trainer_checkpoint", "scale");
  auto const file = dir / "ckpt.bin", plain = dir / "plain.bin";
  spawn(2, [&](ThreadsBackend& comm) {
    TrainerOptions opts{.batch_size = 8, .seed = 3};
    opts.loss_scaling = optim::GradScalerOptions{.init_scale = 1024.0, .growth_interval = 3};
    Model m1 = test::make_blobs_model();
    trainer<Model, ThreadsBackend> t(m1, comm, {.lr = 0.1}, opts);
    t.fit_epoch(data, EpochStart{.epoch = 0}, ce(),
                {.before_step = {}, .after_step = [&](StepPosition const& p, double) {
                   return p.step < 4 ? StepControl::kContinue : StepControl::kStop;
                 }});
    CHECK(*t.loss_scale() == 2048.0);  // grown once after 3 finite steps, tracker at 1
    t.save_checkpoint(file, {.step = 4, .global_step = 4});
    Model m2 = test::make_blobs_model();
    trainer<Model, ThreadsBackend> u(m2, comm, {.lr = 0.1}, opts);
    u.load_checkpoint(file);
    CHECK(*u.loss_scale() == 2048.0);
    // The tracker came along: two more finite steps grow the scale again (a fresh tracker would need three).
    u.fit_epoch(data, EpochStart{.epoch = 0, .step = 4, .global_step = 4}, ce(), {});
    CHECK(*u.loss_scale() == 4096.0);
    // A checkpoint without loss scaling leaves a scaled run at its init_scale.
    Model m3 = test::make_blobs_model();
    trainer<Model, ThreadsBackend> v(m3, comm, {.lr = 0.1}, {.batch_size = 8, .seed = 3});
    v.save_checkpoint(plain, {});
    Model m4 = test::make_blobs_model();
    trainer<Model, ThreadsBackend> w(m4, comm, {.lr = 0.1}, opts);
    w.load_checkpoint(plain);
    CHECK(*w.loss_scale() == 1024.0);
  });
  auto const c = read_checkpoint_file<float>(file);
  REQUIRE(c.loss_scale.has_value());
  CHECK(c.loss_scale->scale == 2048.0);
  CHECK(c.loss_scale->growth_tracker == 1);
  CHECK_FALSE(read_checkpoint_file<float>(plain).loss_scale.has_value());
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "trainer checkpoint: a run resumed mid-epoch reports the whole epoch's train loss, as the uninterrupted run") {
  using namespace trainer_checkpoint_test;
  auto const data = test::blobs(103, 1);
  auto const dir = test::temp_dir("trainer_checkpoint", "epoch_loss");
  auto const file = dir / "ckpt.bin";
  using Plain = trainer<Model, ThreadsBackend>;
  EpochResult whole, resumed;
  std::vector<EpochResult> other_world(4);
  spawn(2, [&](ThreadsBackend& comm) {
    TrainerOptions const opts{.seed = 3, .global_batch = 16, .loss_every = 2};  // losses read two steps at a time
    {
      Model m = test::make_blobs_model();
      Plain t(m, comm, {.lr = 0.1}, opts);
      auto const r = t.fit_epoch(data, EpochStart{}, ce(), {});
      if (comm.rank() == 0) whole = r;
    }
    {
      Model m = test::make_blobs_model();
      Plain t(m, comm, {.lr = 0.1}, opts);
      t.fit_epoch(data, EpochStart{}, ce(),
                  {.before_step = {}, .after_step = [&](StepPosition const& p, double) {
                     if (p.step < 3) return StepControl::kContinue;  // an odd step: one loss still unread
                     t.save_checkpoint(file, {.step = p.step, .global_step = p.global_step, .global_batch = 16});
                     return StepControl::kStop;
                   }});
    }
    Model m = test::make_blobs_model();
    Plain t(m, comm, {.lr = 0.1}, opts);
    EpochLoss prior;
    TrainPosition const pos = t.load_checkpoint(file, nullptr, &prior);
    CHECK(prior.train.total == 3 * 8);  // 3 steps of this rank's 8 samples
    auto const r =
        t.fit_epoch(data, EpochStart{.step = pos.step, .global_step = pos.global_step, .loss = prior}, ce(), {});
    if (comm.rank() == 0) resumed = r;
  });
  CHECK(resumed.train.mean_loss() == whole.train.mean_loss());  // bitwise: the same world size
  CHECK(resumed.train == whole.train);
  CHECK(resumed.steps == whole.steps - 3);
  // At 4 ranks, rank 0 carries the 2 ranks' share: the same figures to rounding.
  spawn(4, [&](ThreadsBackend& comm) {
    Model m = test::make_blobs_model();
    Plain t(m, comm, {.lr = 0.1}, {.seed = 3, .global_batch = 16});
    EpochLoss prior;
    TrainPosition const pos = t.load_checkpoint(file, nullptr, &prior);
    CHECK(prior.train.total == (comm.rank() == 0 ? 2 * 3 * 8 : 0));  // both ranks' 3 steps
    other_world[static_cast<std::size_t>(comm.rank())] =
        t.fit_epoch(data, EpochStart{.step = pos.step, .global_step = pos.global_step, .loss = prior}, ce(), {});
  });
  CHECK(other_world[0].train.mean_loss() == doctest::Approx(whole.train.mean_loss()).epsilon(1e-6));
  CHECK(other_world[0].train.total == whole.train.total);
  CHECK(other_world[0].train.loss_sum == doctest::Approx(whole.train.loss_sum).epsilon(1e-6));
  std::filesystem::remove_all(dir);
}

TEST_CASE("trainer checkpoint: deterministic mode's epoch loss resumes bitwise at another world size") {
  using namespace trainer_checkpoint_test;
  auto const data = test::blobs(96, 2);
  auto const dir = test::temp_dir("trainer_checkpoint", "exact_loss");
  auto const file = dir / "ckpt.bin";
  using Exact = basic_trainer<Model, ThreadsBackend, optim::SGD, SizeCapped, ExactSum, MicroBatches>;
  TrainerOptions const opts{.seed = 3, .global_batch = 16};
  auto make = [&](Model& m, ThreadsBackend& comm) {
    return Exact(m, comm, {.lr = 0.1}, opts, {.batching = {.count = 4}});
  };
  std::vector<double> whole(1), resumed(4);
  spawn(1, [&](ThreadsBackend& comm) {
    Model m = test::make_blobs_model();
    auto t = make(m, comm);
    whole[0] = t.fit_epoch(data, EpochStart{}, ce(), {}).train.mean_loss();
  });
  spawn(2, [&](ThreadsBackend& comm) {
    Model m = test::make_blobs_model();
    auto t = make(m, comm);
    t.fit_epoch(data, EpochStart{}, ce(),
                {.before_step = {}, .after_step = [&](StepPosition const& p, double) {
                   if (p.step < 2) return StepControl::kContinue;
                   t.save_checkpoint(file, {.step = p.step, .global_step = p.global_step, .global_batch = 16});
                   return StepControl::kStop;
                 }});
  });
  spawn(4, [&](ThreadsBackend& comm) {
    Model m = test::make_blobs_model();
    auto t = make(m, comm);
    EpochLoss prior;
    TrainPosition const pos = t.load_checkpoint(file, nullptr, &prior);
    resumed[static_cast<std::size_t>(comm.rank())] =
        t.fit_epoch(data, EpochStart{.step = pos.step, .global_step = pos.global_step, .loss = prior}, ce(), {})
            .train.mean_loss();
  });
  for (double r : resumed) CHECK(r == whole[0]);  // bitwise: 1 rank whole, 2 then 4 ranks resumed
  std::filesystem::remove_all(dir);
}
