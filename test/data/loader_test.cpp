// TensorDataset, DataLoader batching/collation, argmax metrics and the exact distributed-accuracy all-reduce.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "ddp/comm/threads.hpp"
#include "ddp/data/data.hpp"

using namespace ddp;

static_assert(!Dataset<int>);
static_assert(!Dataset<Tensor<float>>);
static_assert(!Sampler<int>);
static_assert(std::input_iterator<DataLoader<TensorDataset<float>>::iterator>);

namespace {

// x (n, 2, 3): element (i, a, b) = 100 i + 10 a + b; y (n): i % 7.
TensorDataset<std::int32_t> grid_dataset(std::int64_t n) {
  Tensor<float> x(Shape{n, 2, 3});
  Tensor<std::int32_t> y(Shape{n});
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t a = 0; a < 2; ++a)
      for (std::int64_t b = 0; b < 3; ++b) x[i * 6 + a * 3 + b] = static_cast<float>(100 * i + 10 * a + b);
    y[i] = static_cast<std::int32_t>(i % 7);
  }
  return {x, y};
}

}  // namespace

TEST_CASE("TensorDataset collates rows in index order, for class ids and regression targets") {
  auto ds = grid_dataset(10);
  CHECK(ds.size() == 10);
  CHECK(ds.sample_shape() == Shape{2, 3});
  std::vector<std::int64_t> idx{7, 0, 7, 3};
  auto b = ds.collate(idx);
  CHECK(b.x.shape() == Shape{4, 2, 3});
  CHECK(b.y.shape() == Shape{4});
  CHECK(b.size() == 4);
  for (std::int64_t i = 0; i < 4; ++i) {
    CHECK(b.y[i] == idx[static_cast<std::size_t>(i)] % 7);
    for (std::int64_t e = 0; e < 6; ++e)
      CHECK(b.x[i * 6 + e] == static_cast<float>(100 * idx[static_cast<std::size_t>(i)] + 10 * (e / 3) + e % 3));
  }
  // The batch is a copy: writing it leaves the dataset alone.
  b.x[0] = -1;
  CHECK(ds.x()[7 * 6] == 700.0f);

  // Regression targets (N, k).
  TensorDataset<float> reg(from_values<float>({3, 1}, {1, 2, 3}), from_values<float>({3, 2}, {10, 11, 20, 21, 30, 31}));
  std::vector<std::int64_t> idx2{2, 1};
  auto rb = reg.collate(idx2);
  CHECK(rb.y.shape() == Shape{2, 2});
  CHECK(rb.y[0] == 30.0f);
  CHECK(rb.y[1] == 31.0f);
  CHECK(rb.y[2] == 20.0f);
  CHECK(rb.x[1] == 2.0f);

  // An empty batch keeps the sample shape.
  auto eb = ds.collate(std::span<std::int64_t const>{});
  CHECK(eb.x.shape() == Shape{0, 2, 3});
}

TEST_CASE("TensorDataset validates shapes and indices") {
  CHECK_THROWS_WITH_AS(TensorDataset<std::int32_t>(zeros<float>({10, 3}), zeros<std::int32_t>({9})),
                       doctest::Contains("x has shape [10, 3] but y has shape [9]"), ShapeError);
  CHECK_THROWS_AS(TensorDataset<float>(zeros<float>({4, 3}), zeros<float>({4, 2, 2})), ShapeError);
  auto ds = grid_dataset(5);
  std::vector<std::int64_t> bad{1, 5};
  CHECK_THROWS_WITH_AS(ds.collate(bad), doctest::Contains("sample index 5 (position 1 of the batch) is outside [0, 5)"),
                       ArgumentError);
  std::vector<std::int64_t> neg{-1};
  CHECK_THROWS_AS(ds.collate(neg), ArgumentError);
}

TEST_CASE("DataLoader cuts the index list into batches; drop_last drops only an incomplete tail") {
  auto ds = grid_dataset(20);
  std::vector<std::int64_t> idx{19, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // 11 indices
  DataLoader keep(ds, idx, {.batch_size = 4});
  DataLoader drop(ds, idx, {.batch_size = 4, .drop_last = true});
  CHECK(keep.num_batches() == 3);
  CHECK(drop.num_batches() == 2);
  CHECK(keep.num_samples() == 11);
  CHECK(drop.num_samples() == 8);
  CHECK(keep.batch(2).size() == 3);
  CHECK(keep.batch(0).x[0] == 1900.0f);
  CHECK(keep.batch(2).x[2 * 6] == 1200.0f);  // last sample of the short batch
  // Exact multiple: drop_last changes nothing.
  CHECK(DataLoader(ds, std::span(idx).first(8), {.batch_size = 4, .drop_last = true}).num_batches() == 2);
  CHECK(DataLoader(ds, std::span(idx).first(3), {.batch_size = 4, .drop_last = true}).num_batches() == 0);

  // Range-for visits the same batches as batch(i), in order.
  std::int64_t i = 0, samples = 0;
  for (auto const& b : keep) {
    auto const ref = keep.batch(i);
    REQUIRE(b.size() == ref.size());
    for (std::int64_t k = 0; k < b.x.numel(); ++k) CHECK(b.x[k] == ref.x[k]);
    samples += b.size();
    ++i;
  }
  CHECK(i == 3);
  CHECK(samples == 11);

  // Resuming part-way visits the remaining batches only.
  std::int64_t resumed = 0;
  for (auto const& b : keep.from(1)) {
    CHECK(b.x[0] == keep.batch(1 + resumed).x[0]);
    ++resumed;
  }
  CHECK(resumed == 2);
  CHECK(keep.from(3).empty());
  CHECK_THROWS_AS(keep.from(4), ArgumentError);

  // The loader copies the list: the sampler may move on to its next epoch.
  DistributedSampler sampler(20, 2, 1);
  DataLoader loader(ds, sampler, {.batch_size = 5});
  auto const first = loader.batch_indices(0)[0];
  sampler.set_epoch(1);
  CHECK(loader.batch_indices(0)[0] == first);
  CHECK(loader.num_batches() == 2);
}

TEST_CASE("DataLoader validates its options and the index list") {
  auto ds = grid_dataset(4);
  std::vector<std::int64_t> idx{0, 1, 4};
  CHECK_THROWS_WITH_AS(DataLoader(ds, std::span(idx).first(2), {.batch_size = 0}), doctest::Contains("batch_size = 0"),
                       ArgumentError);
  CHECK_THROWS_WITH_AS(DataLoader(ds, idx, {.batch_size = 2}),
                       doctest::Contains("index 4 at position 2 of the index list is outside the dataset's [0, 4)"),
                       ArgumentError);
  DataLoader ok(ds, std::span(idx).first(2), {.batch_size = 2});
  CHECK_THROWS_WITH_AS(ok.batch(1), doctest::Contains("batch 1 is outside [0, 1)"), ArgumentError);
}

TEST_CASE("argmax_correct counts argmax hits; ties go to the first class, NaN wins, shapes are checked") {
  auto logits = from_values<float>({4, 3}, {0.1f, 0.7f, 0.2f,                                       // 1
                                            5.0f, 5.0f, 1.0f,                                       // tie -> 0
                                            -1.0f, -2.0f, -0.5f,                                    // 2
                                            0.0f, std::numeric_limits<float>::quiet_NaN(), 9.0f});  // NaN -> 1
  auto pred = argmax_rows(logits);
  CHECK(pred[0] == 1);
  CHECK(pred[1] == 0);
  CHECK(pred[2] == 2);
  CHECK(pred[3] == 1);
  CHECK(argmax_correct(logits, from_values<std::int32_t>({4}, {1, 0, 2, 1})) == 4);
  CHECK(argmax_correct(logits, from_values<std::int32_t>({4}, {1, 1, 0, 2})) == 1);
  CHECK_THROWS_WITH_AS(argmax_correct(logits, zeros<std::int32_t>({3})),
                       doctest::Contains("logits [4, 3] and targets [3]"), ShapeError);
  CHECK_THROWS_WITH_AS(argmax_correct(logits, from_values<std::int32_t>({4}, {1, 0, 3, 1})),
                       doctest::Contains("target 3 at row 2 is outside [0, 3)"), ArgumentError);
  Counts c;
  c.add_batch(3, 4, 0.5);
  c.add_batch(1, 4, 1.5);
  CHECK(c == Counts{.correct = 4, .total = 8, .loss_sum = 8.0});
  CHECK(c.accuracy() == 0.5);
  CHECK(c.mean_loss() == 1.0);
  CHECK(Counts{}.accuracy() == 0.0);
}

TEST_CASE("distributed evaluation with EvalSampler + all_reduce_counts equals single-process accuracy exactly") {
  // 100 samples of 10 "logits" each (the model's output stands in for x) over 3 ranks: 100 % 3 != 0.
  constexpr std::int64_t kN = 100, kC = 10;
  Generator g(123);
  Tensor<float> logits(Shape{kN, kC});
  Tensor<std::int32_t> targets(Shape{kN});
  for (std::int64_t i = 0; i < kN * kC; ++i) logits[i] = static_cast<float>(g.normal());
  for (std::int64_t i = 0; i < kN; ++i) targets[i] = static_cast<std::int32_t>(g.below(kC));
  TensorDataset<std::int32_t> ds(logits, targets);

  // Per-sample "loss": the logit of the target class, so the loss sum is checkable too.
  auto loss_of = [](Batch<std::int32_t> const& b) {
    double s = 0;
    for (std::int64_t i = 0; i < b.size(); ++i) s += b.x[i * kC + b.y[i]];
    return s;
  };
  std::int64_t const correct = argmax_correct(logits, targets);
  double const loss_sum = loss_of(Batch<std::int32_t>{logits, targets});
  REQUIRE(correct > 0);
  REQUIRE(correct < kN);

  std::mutex m;
  std::vector<Counts> reduced, padded;
  ddp::spawn(3, [&](ThreadsBackend& comm) {
    Counts local;
    for (auto const& b : DataLoader(ds, EvalSampler(kN, comm), {.batch_size = 7})) {
      double const l = loss_of(b);
      local.add_batch(argmax_correct(b.x, b.y), b.size(), l / static_cast<double>(b.size()));
    }
    Counts const all = all_reduce_counts(comm, local);
    // The training sampler pads 100 up to 102 samples, double-counting two: why evaluation needs EvalSampler.
    Counts pad;
    for (auto const& b : DataLoader(ds, DistributedSampler(kN, comm, {.shuffle = false}), {.batch_size = 7}))
      pad.add_batch(argmax_correct(b.x, b.y), b.size());
    Counts const pad_all = all_reduce_counts(comm, pad);
    std::lock_guard lock(m);
    reduced.push_back(all);
    padded.push_back(pad_all);
  });
  REQUIRE(reduced.size() == 3);
  for (auto const& c : reduced) {
    CHECK(c.correct == correct);
    CHECK(c.total == kN);
    CHECK(c.accuracy() == static_cast<double>(correct) / kN);
    CHECK(c.loss_sum == doctest::Approx(loss_sum).epsilon(1e-12));
    CHECK(c == reduced[0]);  // bitwise identical on every rank
  }
  for (auto const& c : padded) CHECK(c.total == 102);
}
