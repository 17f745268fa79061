// Samplers: DistributedSampler equals PyTorch's index lists (fixtures), padding and drop_last, shuffling, EvalSampler.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "ddp/comm/threads.hpp"
#include "ddp/data/data.hpp"

using namespace ddp;

namespace {

// An int32 [world_size, steps, per_rank_batch] file from the fixtures (paths relative to the workspace root).
std::vector<std::int32_t> read_i32(std::string const& path, std::size_t expected) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot open fixture ", path);
  std::vector<std::int32_t> v(expected);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(expected * sizeof(std::int32_t)));
  REQUIRE_MESSAGE(f.gcount() == static_cast<std::streamsize>(expected * sizeof(std::int32_t)), path, " is too short");
  char extra;
  REQUIRE_MESSAGE(!f.read(&extra, 1), path, " is longer than expected");
  return v;
}

std::vector<std::int64_t> to_vec(std::span<std::int64_t const> s) { return {s.begin(), s.end()}; }

// x[i] = i, so a collated batch's x spells out its indices.
TensorDataset<std::int32_t> index_dataset(std::int64_t n) {
  Tensor<float> x(Shape{n, 1});
  Tensor<std::int32_t> y(Shape{n});
  for (std::int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = static_cast<std::int32_t>(i % 10);
  }
  return {x, y};
}

// PyTorch's DistributedSampler.__iter__ transcribed (list building, padding by repeating, strided slice), on
// a given epoch order; an independent check of the sampler's closed form.
std::vector<std::int64_t> torch_reference(std::vector<std::int64_t> indices, int R, int rank, bool drop_last) {
  std::int64_t const n = static_cast<std::int64_t>(indices.size());
  std::int64_t num_samples;
  if (drop_last && n % R != 0)
    num_samples = static_cast<std::int64_t>(std::ceil(double(n - R) / R));  // math.ceil((n - R) / R)
  else
    num_samples = static_cast<std::int64_t>(std::ceil(double(n) / R));
  std::int64_t const total = num_samples * R;
  if (!drop_last) {
    std::int64_t const padding = total - n;
    if (padding <= n) {
      indices.insert(indices.end(), indices.begin(), indices.begin() + padding);
    } else {
      std::vector<std::int64_t> rep;
      auto const times = static_cast<std::int64_t>(std::ceil(double(padding) / n));
      for (std::int64_t t = 0; t < times; ++t) rep.insert(rep.end(), indices.begin(), indices.end());
      indices.insert(indices.end(), rep.begin(), rep.begin() + padding);
    }
  } else {
    indices.resize(static_cast<std::size_t>(total));
  }
  REQUIRE(static_cast<std::int64_t>(indices.size()) == total);
  std::vector<std::int64_t> out;
  for (std::int64_t i = rank; i < total; i += R) out.push_back(indices[static_cast<std::size_t>(i)]);
  return out;
}

std::vector<std::int64_t> iota_vec(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

}  // namespace

TEST_CASE("DistributedSampler without shuffle reproduces PyTorch's batches of the toy fixture (3 epochs)") {
  struct Run {
    char const* file;
    int world_size;
    std::int64_t per_rank_batch;
  };
  constexpr std::int64_t kN = 100, kSteps = 30;
  auto const ds = index_dataset(kN);
  for (Run run : {Run{"test/fixtures/toy/batch_idx_ws1.bin", 1, 10}, Run{"test/fixtures/toy/batch_idx_ws2.bin", 2, 5},
                  Run{"test/fixtures/toy/batch_idx_plain.bin", 1, 10}}) {
    CAPTURE(run.file);
    auto const ref = read_i32(run.file, static_cast<std::size_t>(run.world_size * kSteps * run.per_rank_batch));
    for (int r = 0; r < run.world_size; ++r) {
      DistributedSampler sampler(kN, run.world_size, r, {.shuffle = false, .seed = 0, .drop_last = false});
      std::int64_t step = 0;
      for (std::int64_t epoch = 0; step < kSteps; ++epoch) {
        sampler.set_epoch(epoch);
        DataLoader loader(ds, sampler, {.batch_size = run.per_rank_batch, .drop_last = true});
        CHECK(loader.num_batches() == kN / run.world_size / run.per_rank_batch);
        for (auto const& batch : loader) {
          if (step == kSteps) break;
          REQUIRE(batch.size() == run.per_rank_batch);
          for (std::int64_t j = 0; j < run.per_rank_batch; ++j) {
            auto const expected = ref[static_cast<std::size_t>((r * kSteps + step) * run.per_rank_batch + j)];
            INFO("rank ", r, " step ", step, " position ", j);
            CHECK(batch.x[j] == static_cast<float>(expected));
          }
          ++step;
        }
      }
    }
  }
}

TEST_CASE("the shuffled mlp fixture has DistributedSampler's structure, and so do our shuffled lists") {
  // PyTorch's permutation (torch.randperm) is not reproduced; check what any correct sampler guarantees:
  // within an epoch the ranks' batches are disjoint and together cover the 256 samples.
  struct Run {
    char const* file;
    int world_size;
    std::int64_t per_rank_batch;
  };
  constexpr std::int64_t kN = 256, kSteps = 16;
  for (Run run : {Run{"test/fixtures/mlp/batch_idx_ws1.bin", 1, 32}, Run{"test/fixtures/mlp/batch_idx_ws2.bin", 2, 16},
                  Run{"test/fixtures/mlp/batch_idx_ws4.bin", 4, 8}}) {
    CAPTURE(run.file);
    auto const ref = read_i32(run.file, static_cast<std::size_t>(run.world_size * kSteps * run.per_rank_batch));
    std::int64_t const batches_per_epoch = kN / run.world_size / run.per_rank_batch;
    REQUIRE(kSteps % batches_per_epoch == 0);
    bool epochs_differ = false;
    std::vector<std::int32_t> first_epoch;
    for (std::int64_t e = 0; e < kSteps / batches_per_epoch; ++e) {
      std::vector<int> seen(kN, 0);
      std::vector<std::int32_t> order;
      for (int r = 0; r < run.world_size; ++r)
        for (std::int64_t s = e * batches_per_epoch; s < (e + 1) * batches_per_epoch; ++s)
          for (std::int64_t j = 0; j < run.per_rank_batch; ++j) {
            auto const k = ref[static_cast<std::size_t>((r * kSteps + s) * run.per_rank_batch + j)];
            REQUIRE((k >= 0 && k < kN));
            ++seen[static_cast<std::size_t>(k)];
            order.push_back(k);
          }
      CHECK(std::count(seen.begin(), seen.end(), 1) == kN);
      if (e == 0)
        first_epoch = order;
      else
        epochs_differ |= order != first_epoch;
    }
    CHECK(epochs_differ);  // set_epoch reshuffled

    // Ours, same configuration: same per-rank batch counts and the same structure.
    for (std::int64_t e = 0; e < 2; ++e) {
      std::vector<int> seen(kN, 0);
      for (int r = 0; r < run.world_size; ++r) {
        DistributedSampler sampler(kN, run.world_size, r);
        sampler.set_epoch(e);
        auto const ds = index_dataset(kN);
        DataLoader loader(ds, sampler, {.batch_size = run.per_rank_batch, .drop_last = true});
        CHECK(loader.num_batches() == batches_per_epoch);
        for (std::int64_t b = 0; b < loader.num_batches(); ++b)
          for (auto k : loader.batch_indices(b)) ++seen[static_cast<std::size_t>(k)];
      }
      CHECK(std::count(seen.begin(), seen.end(), 1) == kN);
    }
  }
}

TEST_CASE("DistributedSampler pads by repeating from the head, or drops the tail (hand-checked cases)") {
  auto lists = [](std::int64_t n, int R, bool drop_last) {
    std::vector<std::vector<std::int64_t>> out;
    for (int r = 0; r < R; ++r)
      out.push_back(to_vec(DistributedSampler(n, R, r, {.shuffle = false, .drop_last = drop_last}).indices()));
    return out;
  };
  using L = std::vector<std::vector<std::int64_t>>;
  CHECK(lists(5, 2, false) == L{{0, 2, 4}, {1, 3, 0}});                    // total 6: [0 1 2 3 4 | 0]
  CHECK(lists(5, 2, true) == L{{0, 2}, {1, 3}});                           // total 4: sample 4 dropped
  CHECK(lists(7, 3, false) == L{{0, 3, 6}, {1, 4, 0}, {2, 5, 1}});         // total 9: [.. | 0 1]
  CHECK(lists(7, 3, true) == L{{0, 3}, {1, 4}, {2, 5}});                   // total 6
  CHECK(lists(2, 5, false) == L{{0}, {1}, {0}, {1}, {0}});                 // n < R: [0 1 | 0 1 0]
  CHECK(lists(3, 8, false) == L{{0}, {1}, {2}, {0}, {1}, {2}, {0}, {1}});  // repeated as often as needed
  CHECK(lists(2, 5, true) == L{{}, {}, {}, {}, {}});                       // floor(2 / 5) = 0
  CHECK(lists(6, 3, true) == L{{0, 3}, {1, 4}, {2, 5}});                   // divisible: drop_last changes nothing
  CHECK(lists(6, 3, false) == L{{0, 3}, {1, 4}, {2, 5}});
  CHECK(lists(0, 2, false) == L{{}, {}});

  DistributedSampler s(10, 4, 1);
  CHECK(detail::cat(s) ==
        "DistributedSampler{n=10, num_replicas=4, rank=1, shuffle=true, seed=0, drop_last=false, epoch=0}");
  CHECK(detail::cat(EvalSampler(10, 4, 3)) == "EvalSampler{n=10, num_replicas=4, rank=3}");
  CHECK(s.size() == 3);
  CHECK(s.total_size() == 12);
  CHECK(DistributedSampler(10, 4, 1, {.drop_last = true}).total_size() == 8);
}

TEST_CASE("DistributedSampler equals a transcription of PyTorch's __iter__ for many (n, R, drop_last, epoch)") {
  for (std::int64_t n : {0, 1, 2, 3, 5, 7, 10, 16, 17, 33, 100}) {
    for (int R : {1, 2, 3, 4, 5, 8, 13}) {
      for (bool drop_last : {false, true}) {
        for (bool shuffle : {false, true}) {
          if (n == 0 && shuffle) continue;
          CAPTURE(n);
          CAPTURE(R);
          CAPTURE(drop_last);
          CAPTURE(shuffle);
          std::vector<int> count(static_cast<std::size_t>(n), 0);
          std::int64_t total = 0;
          for (int r = 0; r < R; ++r) {
            DistributedSampler s(n, R, r, {.shuffle = shuffle, .seed = 5, .drop_last = drop_last});
            s.set_epoch(3);
            // The epoch order: identity, or the sampler's permutation as seen with one replica.
            DistributedSampler whole(n, 1, 0, {.shuffle = shuffle, .seed = 5});
            whole.set_epoch(3);
            auto const ref = torch_reference(to_vec(whole.indices()), R, r, drop_last);
            REQUIRE(to_vec(s.indices()) == ref);
            CHECK(s.size() == static_cast<std::int64_t>(ref.size()));
            for (auto k : s.indices()) ++count[static_cast<std::size_t>(k)];
            total += s.size();
          }
          CHECK(total == (drop_last ? n / R * R : (n + R - 1) / R * R));
          if (!drop_last) {
            // Every sample appears; the padding repeats at most ceil(R / n) extra times.
            for (int c : count) CHECK(c >= 1);
          } else {
            for (int c : count) CHECK(c <= 1);
          }
        }
      }
    }
  }
}

TEST_CASE("set_epoch reshuffles deterministically with a portable Fisher-Yates permutation") {
  constexpr std::int64_t kN = 50;
  DistributedSampler a(kN, 1, 0), b(kN, 1, 0, {.seed = 0});
  auto const e0 = to_vec(a.indices());
  // A permutation of 0..n-1, and not the identity.
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == iota_vec(kN));
  CHECK(e0 != iota_vec(kN));
  // Same seed and epoch: same order, whichever instance and however often.
  CHECK(to_vec(b.indices()) == e0);
  a.set_epoch(1);
  auto const e1 = to_vec(a.indices());
  CHECK(e1 != e0);
  a.set_epoch(0);
  CHECK(to_vec(a.indices()) == e0);
  // The permutation is Generator(seed + epoch).shuffle of 0..n-1, so seed 1 epoch 0 equals seed 0 epoch 1.
  CHECK(to_vec(DistributedSampler(kN, 1, 0, {.seed = 1}).indices()) == e1);
  auto manual = iota_vec(kN);
  Generator(0 + 1).shuffle(manual.begin(), manual.end());
  CHECK(manual == e1);
  CHECK(to_vec(DistributedSampler(kN, 1, 0, {.seed = 2}).indices()) != e0);
  // RandomSampler is the one-replica DistributedSampler.
  RandomSampler rs(kN, {.seed = 0});
  CHECK(to_vec(rs.indices()) == e0);
  rs.set_epoch(1);
  CHECK(to_vec(rs.indices()) == e1);
  CHECK(to_vec(SequentialSampler(kN).indices()) == iota_vec(kN));

  // Ranks of a shuffled epoch are disjoint and cover the dataset (n divisible by R).
  for (int R : {2, 5}) {
    std::vector<int> count(kN, 0);
    for (int r = 0; r < R; ++r) {
      DistributedSampler s(kN, R, r, {.seed = 9});
      s.set_epoch(4);
      for (auto k : s.indices()) ++count[static_cast<std::size_t>(k)];
    }
    CHECK(std::count(count.begin(), count.end(), 1) == kN);
  }
}

TEST_CASE("sampler arguments are validated with clear errors") {
  CHECK_THROWS_WITH_AS(DistributedSampler(10, 2, 2), doctest::Contains("rank 2 is outside [0, 2)"), ArgumentError);
  CHECK_THROWS_WITH_AS(DistributedSampler(10, 2, -1), doctest::Contains("rank -1"), ArgumentError);
  CHECK_THROWS_WITH_AS(DistributedSampler(10, 0, 0), doctest::Contains("num_replicas = 0"), ArgumentError);
  CHECK_THROWS_WITH_AS(DistributedSampler(-1, 1, 0), doctest::Contains("dataset size -1"), ArgumentError);
  DistributedSampler s(10, 1, 0);
  CHECK_THROWS_WITH_AS(s.set_epoch(-1), doctest::Contains("epoch -1"), ArgumentError);
  CHECK_THROWS_WITH_AS(EvalSampler(10, 3, 3), doctest::Contains("EvalSampler: rank 3"), ArgumentError);
  CHECK_THROWS_AS(SequentialSampler(-2), ArgumentError);
}

TEST_CASE("EvalSampler visits every sample exactly once across ranks, without padding") {
  for (std::int64_t n : {0, 1, 2, 7, 10, 99, 100, 101}) {
    for (int R : {1, 2, 3, 4, 7, 16}) {
      CAPTURE(n);
      CAPTURE(R);
      std::vector<int> count(static_cast<std::size_t>(n), 0);
      std::int64_t smallest = n, largest = 0;
      for (int r = 0; r < R; ++r) {
        EvalSampler s(n, R, r);
        smallest = std::min(smallest, s.size());
        largest = std::max(largest, s.size());
        std::int64_t prev = -1;
        for (auto k : s.indices()) {
          CHECK(k % R == r);  // rank r takes r, r + R, ...
          CHECK(k > prev);
          prev = k;
          ++count[static_cast<std::size_t>(k)];
        }
      }
      CHECK(std::count(count.begin(), count.end(), 1) == n);
      CHECK(largest - smallest <= 1);
    }
  }
}

TEST_CASE("samplers take num_replicas and rank from a communicator") {
  ddp::spawn(3, [](ThreadsBackend& comm) {
    DistributedSampler d(10, comm, {.shuffle = false});
    EvalSampler e(10, comm);
    CHECK(d.rank() == comm.rank());
    CHECK(d.num_replicas() == 3);
    CHECK(d.indices()[0] == comm.rank());
    CHECK(e.indices()[0] == comm.rank());
  });
}
