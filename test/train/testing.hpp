// Helpers shared by the train tests: a fresh scratch directory, raw bytes to a file, and the trainer tests'
// three-class blobs with a small MLP for them.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "ddp/ddp.hpp"

namespace ddp::test {

// An empty directory `<prefix>_<name>` under $TEST_TMPDIR (Bazel's per-test scratch space) or /tmp.
inline std::filesystem::path temp_dir(std::string const& prefix, std::string const& name) {
  char const* t = std::getenv("TEST_TMPDIR");
  std::filesystem::path d = std::filesystem::path(t ? t : "/tmp") / (prefix + "_" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// Overwrites `p` with exactly `bytes`.
inline void dump(std::filesystem::path const& p, std::string const& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << bytes;
}

// n samples of 4 features in 3 classes: class c has feature c raised by 1.5 over uniform noise.
inline TensorDataset<std::int32_t> blobs(std::int64_t n, std::uint64_t seed) {
  Generator g(seed);
  Tensor<float> x(Shape{n, 4});
  Tensor<std::int32_t> y(Shape{n});
  for (std::int64_t i = 0; i < n; ++i) {
    y[i] = static_cast<std::int32_t>(g.below(3));
    for (int j = 0; j < 4; ++j) x[i * 4 + j] = g.uniform(-0.5f, 0.5f) + (j == y[i] ? 1.5f : 0.0f);
  }
  return TensorDataset<std::int32_t>(x, y);
}

// 4-16-3 MLP for blobs(), the same weights every call.
inline auto make_blobs_model() {
  Generator g(11);
  return nn::Sequential(nn::Linear(4, 16, g), nn::ReLU(), nn::Linear(16, 3, g));
}

}  // namespace ddp::test
