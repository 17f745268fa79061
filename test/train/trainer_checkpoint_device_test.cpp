// basic_trainer's checkpoints under fp16 autocast on device tensors (Thrust's CPU system in CI): the loss scale
// moves during the run (it grows every other step), the checkpoint keeps it and its growth tracker, and the run
// resumed mid-epoch is bitwise the uninterrupted one on every rank. The scale starts at 2^-12, so that the scaled
// output gradients lie in float16's subnormal range, where each growth keeps more of their bits: a resume that
// started again from init_scale differs, so the test would catch a lost scale.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/precision.hpp"
#include "test/parallel/ddp_device_cases.hpp"
#include "test/train/testing.hpp"

TEST_CASE("trainer checkpoint: an fp16 run on device tensors with a moving loss scale resumes bitwise") {
  using namespace ddp;
  using D = DeviceSpace;
  auto const raw = test::make_data(96, 8, 4, 17);
  TensorDataset<float> const data(raw.x, raw.y);
  auto const dir = test::temp_dir("trainer_checkpoint", "fp16");
  auto const file = dir / "ckpt.bin";
  using Model = decltype(test::device::make_mlp<D>(8, 32, 4, 1));
  using Trainer = basic_trainer<Model, ThreadsBackend, optim::basic_sgd<float, D>>;
  TrainerOptions opts{.batch_size = 8, .seed = 5};
  opts.loss_scaling = optim::GradScalerOptions{.init_scale = std::ldexp(1.0, -12), .growth_interval = 2};
  auto const mse = [](Variable<float, D> const& out, auto const& b) { return mse_loss(out, to_space<D>(b.y)); };
  auto const weights = [](Trainer& t) { return test::device::weights(t.ddp().parameters()); };
  std::vector<std::vector<float>> whole(2), resumed(2), unscaled(2);
  std::vector<double> scale(2);
  spawn(2, [&](ThreadsBackend& comm) {
    auto const r = static_cast<std::size_t>(comm.rank());
    autocast fp16(Precision::kFp16);  // this rank's thread computes its GEMMs from float16 operands
    {
      Model m = test::device::make_mlp<D>(8, 32, 4, 1);
      Trainer t(m, comm, {.lr = 0.05, .momentum = 0.9}, opts);
      t.fit_epoch(data, {.epoch = 0}, mse);
      whole[r] = weights(t);
      scale[r] = *t.loss_scale();
    }
    {
      Model m = test::device::make_mlp<D>(8, 32, 4, 1);
      Trainer t(m, comm, {.lr = 0.05, .momentum = 0.9}, opts);
      t.fit_epoch(data, EpochStart{}, mse, {.before_step = {}, .after_step = [&](StepPosition const& p, double) {
                                              if (p.step < 3) return StepControl::kContinue;
                                              t.save_checkpoint(file, {.step = p.step, .global_step = p.global_step});
                                              return StepControl::kStop;
                                            }});
      CHECK(*t.loss_scale() == std::ldexp(1.0, -11));  // grown once; the growth tracker is at 1
    }
    for (bool with_scale : {true, false}) {
      Model m = test::device::make_mlp<D>(8, 32, 4, 1);
      Trainer t(m, comm, {.lr = 0.05, .momentum = 0.9}, opts);
      TrainPosition const pos =
          with_scale ? t.load_checkpoint(file) : load_checkpoint(file, comm, t.ddp().module(), t.optimizer());
      t.fit_epoch(data, EpochStart{.step = pos.step, .global_step = pos.global_step}, mse, {});
      (with_scale ? resumed : unscaled)[r] = weights(t);
      if (with_scale) CHECK(*t.loss_scale() == scale[r]);
    }
  });
  CHECK(scale[0] == std::ldexp(1.0, -9));  // 6 steps, growing every second: the scale moved three times
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(resumed[r] == whole[r]);
    CHECK(unscaled[r] != whole[r]);  // the scale matters under fp16
  }
  std::filesystem::remove_all(dir);
}
