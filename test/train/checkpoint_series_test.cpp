// CheckpointSeries (train/checkpoint_series.hpp): the last few checkpoints, newest first; a restarted job resumes
// from the newest usable one at whatever world size it now has (basic_trainer::resume_newest), skipping a torn one,
// starting fresh when there is none, refusing another run's. A deterministic job interrupted twice and restarted at
// other world sizes ends bitwise the uninterrupted run.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/ddp.hpp"
#include "test/train/testing.hpp"

using namespace ddp;

namespace checkpoint_series_test {

namespace fs = std::filesystem;
using Model = decltype(test::make_blobs_model());
using Trainer = basic_trainer<Model, ThreadsBackend, optim::AdamW, SizeCapped, ExactSum, MicroBatches>;

inline Trainer make_trainer(Model& m, ThreadsBackend& comm) {
  return Trainer(m, comm, {.lr = 0.01}, {.seed = 3, .global_batch = 16}, {.batching = {.count = 4}});
}

inline std::vector<float> weights(Trainer& t) {
  std::vector<float> v;
  for (auto const& p : t.ddp().parameters().entries())
    v.insert(v.end(), p.var.value().data(), p.var.value().data() + p.numel);
  return v;
}

// One attempt of a job: resumes from the series' newest checkpoint (or starts), trains to the end of epoch 2 (6 steps
// each), writes the series every 2 optimizer steps, and stops after global step `stop_after` (0: never), as a killed
// process would: without a checkpoint there. Returns rank 0's weights and where it resumed (global step, -1: fresh).
struct Attempt {
  std::vector<float> weights;
  std::int64_t resumed_at = -1;
  std::vector<std::string> skipped;
};
inline Attempt run_attempt(int world, CheckpointSeries const& series, std::int64_t stop_after) {
  auto const data = test::blobs(103, 1);
  Attempt out;
  spawn(world, [&](ThreadsBackend& comm) {
    Model m = test::make_blobs_model();
    auto t = make_trainer(m, comm);
    TrainPosition pos;
    EpochLoss loss;
    if (auto r = t.resume_newest(series, nullptr, &loss)) {
      pos = r->position;
      if (comm.rank() == 0) {
        out.resumed_at = pos.global_step;
        out.skipped = r->skipped;
      }
    }
    bool stopped = false;
    for (std::int64_t e = pos.epoch; e < 2 && !stopped; ++e) {
      auto const r = t.fit_epoch(data,
                                 EpochStart{.epoch = e,
                                            .step = e == pos.epoch ? pos.step : 0,
                                            .global_step = pos.global_step,
                                            .loss = std::exchange(loss, {})},
                                 [](Var const& o, auto const& mb) { return cross_entropy(o, mb.y); },
                                 {.before_step = {}, .after_step = [&](StepPosition const& p, double) {
                                    if (stop_after > 0 && p.global_step == stop_after) return StepControl::kStop;
                                    if (p.global_step % 2 == 0) {
                                      bool const end = p.step == p.steps_in_epoch;
                                      t.save_checkpoint(series, {.epoch = end ? p.epoch + 1 : p.epoch,
                                                                 .step = end ? 0 : p.step,
                                                                 .global_step = p.global_step,
                                                                 .world_size = world,
                                                                 .global_batch = 16,
                                                                 .seed = 3});
                                    }
                                    return StepControl::kContinue;
                                  }});
      pos.global_step = r.global_step;
      stopped = r.stopped;
    }
    if (comm.rank() == 0) out.weights = weights(t);
  });
  return out;
}

inline std::int64_t step_in(fs::path const& f) { return read_checkpoint_file<float>(f).position.global_step; }

}  // namespace checkpoint_series_test

TEST_CASE("checkpoint series: writing keeps the last `keep` files, newest first under FILE, FILE.1, FILE.2") {
  using namespace checkpoint_series_test;
  auto const dir = test::temp_dir("checkpoint_series", "rotation");
  CheckpointSeries const series(dir / "ckpt", {.keep = 3});
  CHECK(series.files() == std::vector<fs::path>{dir / "ckpt", dir / "ckpt.1", dir / "ckpt.2"});
  auto const a = run_attempt(1, series, 0);  // 12 steps: files at 12, 10, 8
  CHECK(a.resumed_at == -1);
  CHECK(step_in(dir / "ckpt") == 12);
  CHECK(step_in(dir / "ckpt.1") == 10);
  CHECK(step_in(dir / "ckpt.2") == 8);
  CHECK_FALSE(fs::exists(dir / "ckpt.3"));
  std::size_t files = 0;  // no temporary left behind
  for (auto const& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  CHECK(files == 3);

  CheckpointSeries const one(dir / "single", {.keep = 1});
  CHECK(one.files() == std::vector<fs::path>{dir / "single"});
  (void)run_attempt(1, one, 0);
  CHECK(step_in(dir / "single") == 12);
  CHECK_FALSE(fs::exists(dir / "single.1"));

  CHECK_THROWS_WITH_AS(CheckpointSeries(dir / "x", {.keep = 0}), doctest::Contains("keep = 0 keeps no checkpoint"),
                       ArgumentError);
  CHECK_THROWS_WITH_AS(CheckpointSeries(""), doctest::Contains("the checkpoint path is empty"), ArgumentError);
  CHECK_THROWS_WITH_AS(CheckpointSeries(dir / ""), doctest::Contains("names a directory"), ArgumentError);
}

TEST_CASE("checkpoint series: FILE is never absent while the next checkpoint is written; FILE.1 is the one before") {
  using namespace checkpoint_series_test;
  auto const dir = test::temp_dir("checkpoint_series", "never_absent");
  CheckpointSeries const series(dir / "ckpt", {.keep = 3});
  series.write("first");
  std::atomic<bool> done{false};
  std::atomic<int> looks{0}, absent{0};
  std::thread reader([&] {
    while (!done.load()) {
      std::error_code ec;
      absent += !fs::exists(dir / "ckpt", ec);
      ++looks;
    }
  });
  std::string const big(1 << 20, 'x');  // a write and fsync long enough for the reader to look many times
  for (int i = 0; i < 40; ++i) series.write(big + std::to_string(i));
  done = true;
  reader.join();
  CHECK(looks.load() > 0);
  CHECK(absent.load() == 0);
  auto const text = [](fs::path const& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  CHECK(text(dir / "ckpt") == big + "39");
  CHECK(text(dir / "ckpt.1") == big + "38");
  CHECK(text(dir / "ckpt.2") == big + "37");
  std::size_t files = 0;  // no temporary or link left behind
  for (auto const& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  CHECK(files == 3);
  // A link left by a writer that was killed between linking and renaming is removed by the next writer.
  std::ofstream(dir / detail::cat(detail::temporary_prefix(dir / "ckpt.1"), 999999999, ".link")) << "stale";
  series.write("again");
  files = 0;
  for (auto const& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  CHECK(files == 3);
  CHECK(text(dir / "ckpt.1") == big + "39");
  // A writer killed after FILE.1 became FILE's file and before FILE was replaced leaves the two names on one file;
  // the next write (keep 2: FILE.1 is the oldest, replaced) still ends with the newest and the one before, nothing
  // else.
  auto const two = test::temp_dir("checkpoint_series", "never_absent_keep2");
  CheckpointSeries const pair(two / "ckpt", {.keep = 2});
  pair.write("a");
  fs::create_hard_link(two / "ckpt", two / "ckpt.1");
  pair.write("b");
  CHECK(text(two / "ckpt") == "b");
  CHECK(text(two / "ckpt.1") == "a");
  files = 0;
  for (auto const& e : fs::directory_iterator(two)) files += e.is_regular_file();
  CHECK(files == 2);
}

TEST_CASE(
    "checkpoint series: a deterministic job killed twice and restarted at 4, then 1 rank ends bitwise the "
    "uninterrupted run") {
  using namespace checkpoint_series_test;
  auto const dir = test::temp_dir("checkpoint_series", "restart");
  auto const whole = run_attempt(2, CheckpointSeries(dir / "whole"), 0).weights;
  CheckpointSeries const series(dir / "ckpt");
  auto const first = run_attempt(2, series, 5);  // killed after step 5: the newest checkpoint is step 4's
  CHECK(first.resumed_at == -1);
  auto const second = run_attempt(4, series, 9);  // resumes at 4 mid-epoch 0, killed after step 9 (in epoch 1)
  CHECK(second.resumed_at == 4);
  CHECK(second.skipped.empty());
  auto const third = run_attempt(1, series, 0);
  CHECK(third.resumed_at == 8);
  REQUIRE_FALSE(whole.empty());
  CHECK(third.weights == whole);
  // A job that finds its series complete resumes at the end and trains nothing more.
  auto const again = run_attempt(2, series, 0);
  CHECK(again.resumed_at == 12);
  CHECK(again.weights == whole);
}

TEST_CASE(
    "checkpoint series: a torn newest file falls back to the one before, named with its reason; all torn is "
    "an error on every rank; another model's is refused") {
  using namespace checkpoint_series_test;
  auto const dir = test::temp_dir("checkpoint_series", "torn");
  auto const whole = run_attempt(2, CheckpointSeries(dir / "whole"), 0).weights;
  CheckpointSeries const series(dir / "ckpt");
  (void)run_attempt(2, series, 7);  // files at 6, 4, 2
  fs::resize_file(dir / "ckpt", fs::file_size(dir / "ckpt") / 2);
  auto const resumed = run_attempt(2, series, 0);
  CHECK(resumed.resumed_at == 4);
  REQUIRE(resumed.skipped.size() == 1);
  CHECK(resumed.skipped[0].find((dir / "ckpt").string()) != std::string::npos);
  CHECK(resumed.weights == whole);

  // Every file of the series unusable: nothing is started over them; every rank names each file.
  CheckpointSeries const broken(dir / "broken");
  for (auto const& f : broken.files()) test::dump(f, "not a checkpoint");
  std::vector<std::string> errors(2);
  spawn(2, [&](ThreadsBackend& comm) {
    Model m = test::make_blobs_model();
    auto t = make_trainer(m, comm);
    try {
      (void)t.resume_newest(broken);
    } catch (IoError const& e) {
      errors[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  for (auto const& e : errors) {
    CHECK(e.find("no usable checkpoint in the series " + (dir / "broken").string()) != std::string::npos);
    for (auto const& f : broken.files()) CHECK(e.find(f.string()) != std::string::npos);
  }

  // A usable file of another model (a wider hidden layer): refused by name on every rank, not skipped.
  CheckpointSeries const other(dir / "other");
  spawn(1, [&](ThreadsBackend& comm) {
    Generator g(11);
    auto wide = nn::Sequential(nn::Linear(4, 9, g), nn::ReLU(), nn::Linear(9, 3, g));
    basic_trainer<decltype(wide), ThreadsBackend, optim::AdamW, SizeCapped, ExactSum, MicroBatches> t(
        wide, comm, {.lr = 0.01}, {.seed = 3, .global_batch = 16}, {.batching = {.count = 4}});
    t.save_checkpoint(other, {.global_step = 1});
  });
  std::vector<std::string> refusals(2);
  spawn(2, [&](ThreadsBackend& comm) {
    Model m = test::make_blobs_model();
    auto t = make_trainer(m, comm);
    try {
      (void)t.resume_newest(other);
    } catch (ArgumentError const& e) {
      refusals[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  for (auto const& e : refusals) CHECK(e.find((dir / "other").string()) != std::string::npos);
}
